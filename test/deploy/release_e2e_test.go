//go:build e2e

package deploy

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// The release tests run what `make release-snapshot` builds: scripts/release.sh snapshot (goreleaser, then the
// chart) into dist/. scripts/test.sh builds it once per run and sets GPE_RELEASE_DIST; without it the first test
// that needs it builds it.

var (
	distOnce sync.Once
	distDir  string
	distErr  error
	distLog  string // what the build printed, when this test run built it
	distMeta struct {
		Version string `json:"version"`
		Commit  string `json:"commit"`
	}
)

func releaseDist(t *testing.T) string {
	t.Helper()
	distOnce.Do(func() {
		distDir = os.Getenv("GPE_RELEASE_DIST")
		if distDir == "" {
			start := time.Now()
			cmd := exec.Command("bash", "scripts/release.sh", "snapshot")
			cmd.Dir = repoRoot(t)
			cmd.Env = append(os.Environ(), freshCgo())
			out, err := cmd.CombinedOutput()
			distLog = string(out)
			if err != nil {
				distErr = fmt.Errorf("scripts/release.sh snapshot: %v\n%s", err, tail(string(out), 40))
				return
			}
			fmt.Fprintf(os.Stderr, "test/deploy: release snapshot built in %s\n", time.Since(start).Round(time.Second))
			distDir = filepath.Join(repoRoot(t), "dist")
		}
		b, err := os.ReadFile(filepath.Join(distDir, "metadata.json"))
		if err != nil {
			distErr = err
			return
		}
		distErr = json.Unmarshal(b, &distMeta)
	})
	if distErr != nil {
		t.Fatal(distErr)
	}
	return distDir
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestReleaseBuildPrintsNoCompilerWarnings: goreleaser's builds (both architectures, with cgo and go-nvml compiled
// afresh) print no compiler warning; goreleaser logs what a build prints.
func TestReleaseBuildPrintsNoCompilerWarnings(t *testing.T) {
	releaseDist(t)
	out := distLog
	if p := os.Getenv("GPE_RELEASE_LOG"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = string(b)
	} else if out == "" {
		t.Skip("GPE_RELEASE_DIST names a release built elsewhere, and no GPE_RELEASE_LOG says what its build printed")
	}
	for _, arch := range []string{"linux_amd64", "linux_arm64"} {
		if !strings.Contains(out, "building") || !strings.Contains(out, arch) {
			t.Fatalf("the release log shows no build for %s, so nothing can be said of its warnings:\n%s", arch, tail(out, 40))
		}
	}
	if w := compilerWarnings(out); len(w) > 0 {
		t.Errorf("the release build printed warnings:\n%s", strings.Join(w, "\n"))
	}
}

// TestReleaseArtifacts: what a release page lists, each checksum right.
func TestReleaseArtifacts(t *testing.T) {
	dist := releaseDist(t)
	v := distMeta.Version
	if !regexp.MustCompile(`^\d+\.\d+\.\d+-snapshot\.[0-9a-f]+$`).MatchString(v) {
		t.Errorf("snapshot version %q", v)
	}
	want := []string{
		"gpu-pod-exporter-" + v + ".linux-amd64.tar.gz", "gpu-pod-exporter-" + v + ".linux-arm64.tar.gz",
		"gpu-pod-exporter_" + v + "_amd64.deb", "gpu-pod-exporter_" + v + "_arm64.deb",
		"gpu-pod-exporter_" + v + "_amd64.rpm", "gpu-pod-exporter_" + v + "_arm64.rpm",
	}
	sums := map[string]string{}
	f, err := os.Open(filepath.Join(dist, "sha256sums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 {
			sums[fields[1]] = fields[0]
		}
	}
	for _, name := range want {
		b, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Errorf("missing %s: %v", name, err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); sums[name] != got {
			t.Errorf("sha256sums.txt says %q for %s, the file has %s", sums[name], name, got)
		}
	}
	for _, arch := range []string{"amd64", "arm64"} {
		dir := "gpu-pod-exporter-" + v + ".linux-" + arch + "/"
		got := tarNames(t, filepath.Join(dist, "gpu-pod-exporter-"+v+".linux-"+arch+".tar.gz"))
		for _, f := range append([]string{"gpu-pod-exporter", "LICENSE", "deploy/systemd/gpu-pod-exporter.service",
			"man/gpu-pod-exporter.1.gz", "completions/gpu-pod-exporter.bash", "completions/_gpu-pod-exporter",
			"completions/gpu-pod-exporter.fish"}, shippedDocs...) {
			if !slices.Contains(got, dir+f) {
				t.Errorf("the %s archive lacks %s: %v", arch, dir+f, got)
			}
		}
		var shipped []string
		for _, name := range got {
			shipped = append(shipped, strings.TrimPrefix(name, dir))
		}
		checkShippedDocLinks(t, "the "+arch+" archive", shipped)
	}
	chart := filepath.Join(dist, "charts", "gpu-pod-exporter-"+v+".tgz")
	if _, err := os.Stat(chart); err != nil {
		t.Errorf("no packaged chart: %v", err)
	}
	index, err := os.ReadFile(filepath.Join(dist, "charts", "index.yaml"))
	if err != nil || !strings.Contains(string(index), "version: "+v) || !strings.Contains(string(index), "appVersion: "+v) {
		t.Errorf("chart repository index without version %s: %v\n%s", v, err, index)
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, strings.TrimSuffix(h.Name, "/"))
	}
}

// extractArchive unpacks a release archive into a temporary directory and returns the binary's path.
func extractArchive(t *testing.T, arch string) string {
	t.Helper()
	dist := releaseDist(t)
	dir := t.TempDir()
	name := "gpu-pod-exporter-" + distMeta.Version + ".linux-" + arch
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dist, name+".tar.gz"), "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	return filepath.Join(dir, name, "gpu-pod-exporter")
}

// checkVersionOutput: --version names the release's version, the commit, and a build date.
func checkVersionOutput(t *testing.T, out, version string) {
	t.Helper()
	for _, want := range []string{"version " + version + " ", "revision: " + distMeta.Commit} {
		if !strings.Contains(out, want) {
			t.Errorf("--version lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`build date:\s+20\d{6}-\d\d:\d\d:\d\d`).MatchString(out) {
		t.Errorf("--version has no build date:\n%s", out)
	}
}

// TestReleaseBinaryAmd64 runs the amd64 binary from its archive: --version, and --demo scraped.
func TestReleaseBinaryAmd64(t *testing.T) {
	bin := extractArchive(t, "amd64")
	checkELF(t, bin, elf.EM_X86_64)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	checkVersionOutput(t, string(out), distMeta.Version)
	addr := e2eutil.FreeAddr(t)
	p := e2eutil.Start(t, exec.Command(bin, "--demo", "--web.listen-address="+addr))
	e2eutil.WaitListening(t, p, addr, 30*time.Second)
	checkDemoScrape(t, addr)
}

// TestReleaseBinaryArm64 runs the arm64 binary (GH200, GB200 nodes) under qemu-aarch64-static with the arm64 glibc of
// Debian's cross toolchain, and has a real Prometheus scrape it.
func TestReleaseBinaryArm64(t *testing.T) {
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		t.Fatal("qemu-aarch64-static is missing: apt-get install qemu-user-static (scripts/test.sh does)")
	}
	const sysroot = "/usr/aarch64-linux-gnu" // libc6-arm64-cross
	if _, err := os.Stat(filepath.Join(sysroot, "lib/ld-linux-aarch64.so.1")); err != nil {
		t.Fatalf("no arm64 glibc at %s: apt-get install libc6-arm64-cross (%v)", sysroot, err)
	}
	bin := extractArchive(t, "arm64")
	checkELF(t, bin, elf.EM_AARCH64)
	out, err := exec.Command(qemu, "-L", sysroot, bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version under qemu: %v\n%s", err, out)
	}
	checkVersionOutput(t, string(out), distMeta.Version)
	if !strings.Contains(string(out), "platform:         linux/arm64") {
		t.Errorf("--version does not say linux/arm64:\n%s", out)
	}
	addr := e2eutil.FreeAddr(t)
	p := e2eutil.Start(t, exec.Command(qemu, "-L", sysroot, bin, "--demo", "--web.listen-address="+addr))
	e2eutil.WaitListening(t, p, addr, 60*time.Second)
	checkDemoScrape(t, addr)

	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))
	var res []e2eutil.Sample
	testkit.WaitFor(t, 60*time.Second, "Prometheus to scrape the arm64 exporter", func() bool {
		res, _ = e2eutil.TryQuery(prom, `gpu_pod_exporter_build_info{version="`+distMeta.Version+`"}`)
		return len(res) == 1
	})
	res = e2eutil.Query(t, prom, `count(gpu_workload_memory_used_bytes{pod="bert-finetune-7c9d8b6f4-x2kqp"})`)
	if len(res) != 1 || res[0].Value < 1 {
		t.Errorf("Prometheus has no workload series of the demo from the arm64 exporter: %+v", res)
	}
}

func checkELF(t *testing.T, path string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != machine {
		t.Errorf("%s is for %s, want %s", path, f.Machine, machine)
	}
	// cgo: dynamically linked against glibc, for dlopen of libnvidia-ml.so.1.
	if libs, _ := f.ImportedLibraries(); !slices.Contains(libs, "libc.so.6") {
		t.Errorf("%s does not link glibc (cgo off?): %v", path, libs)
	}
}

func checkDemoScrape(t *testing.T, addr string) {
	t.Helper()
	body, families := e2eutil.Scrape(t, addr)
	if !strings.Contains(body, `pod="bert-finetune-7c9d8b6f4-x2kqp"`) {
		t.Errorf("the demo's metrics lack the demo pod")
	}
	bi := families["gpu_pod_exporter_build_info"]
	if bi == nil || len(bi.Metric) != 1 {
		t.Fatalf("no gpu_pod_exporter_build_info")
	}
	if got := e2eutil.Label(bi.Metric[0], "version"); got != distMeta.Version {
		t.Errorf("build_info version %q, want %q", got, distMeta.Version)
	}
	if got := e2eutil.Label(bi.Metric[0], "revision"); got != distMeta.Commit {
		t.Errorf("build_info revision %q, want the release's commit %s", got, distMeta.Commit)
	}
}

// TestReleasePackages lists the .deb and .rpm with dpkg-deb and rpm, unpacks each into a root, and runs
// systemd-analyze verify on the unit at its installed path, with the packaged binary where it points.
func TestReleasePackages(t *testing.T) {
	dist := releaseDist(t)
	v := distMeta.Version
	const docDir = "/usr/share/doc/gpu-pod-exporter/"
	common := []string{"/usr/bin/gpu-pod-exporter", "/usr/lib/systemd/system/gpu-pod-exporter.service", docDir + "LICENSE",
		manPage, "/usr/share/bash-completion/completions/gpu-pod-exporter",
		"/usr/share/fish/vendor_completions.d/gpu-pod-exporter.fish"}
	for _, f := range shippedDocs {
		common = append(common, docDir+f)
	}
	docsIn := func(files []string) []string {
		var out []string
		for _, f := range files {
			if rel, ok := strings.CutPrefix(f, docDir); ok {
				out = append(out, rel)
			}
		}
		return out
	}
	for _, arch := range []struct{ deb, rpm string }{{"amd64", "x86_64"}, {"arm64", "aarch64"}} {
		t.Run("deb/"+arch.deb, func(t *testing.T) {
			deb := filepath.Join(dist, "gpu-pod-exporter_"+v+"_"+arch.deb+".deb")
			var files []string
			for _, line := range strings.Split(string(run(t, "dpkg-deb", "-c", deb)), "\n") {
				if f := strings.Fields(line); len(f) >= 6 && !strings.HasSuffix(f[5], "/") {
					files = append(files, strings.TrimPrefix(f[5], "."))
				}
			}
			checkFileList(t, files, append(common, "/etc/default/gpu-pod-exporter", "/usr/share/zsh/vendor-completions/_gpu-pod-exporter"),
				"/etc/sysconfig/gpu-pod-exporter")
			checkShippedDocLinks(t, "the .deb", docsIn(files))
			if got := strings.TrimSpace(string(run(t, "dpkg-deb", "-f", deb, "Architecture"))); got != arch.deb {
				t.Errorf("Architecture %q", got)
			}
			if got := strings.TrimSpace(string(run(t, "dpkg-deb", "-f", deb, "Depends"))); got != "libc6 (>= 2.34)" {
				t.Errorf("Depends %q, want libc6 (>= 2.34)", got)
			}
			control := t.TempDir()
			run(t, "dpkg-deb", "-e", deb, control)
			if b, _ := os.ReadFile(filepath.Join(control, "conffiles")); !strings.Contains(string(b), "/etc/default/gpu-pod-exporter") {
				t.Errorf("/etc/default/gpu-pod-exporter is not a conffile: %q", b)
			}
			for script, src := range map[string]string{"postinst": "postinstall.sh", "prerm": "preremove.sh", "postrm": "postremove.sh"} {
				got, _ := os.ReadFile(filepath.Join(control, script))
				if want := readRepoFile(t, "packaging/"+src); string(got) != string(want) {
					t.Errorf("the .deb's %s is not packaging/%s", script, src)
				}
			}
			root := t.TempDir()
			run(t, "dpkg-deb", "-x", deb, root)
			verifyInstalledUnit(t, root)
			verifyManPage(t, root, v)
		})
		t.Run("rpm/"+arch.deb, func(t *testing.T) {
			rpm := filepath.Join(dist, "gpu-pod-exporter_"+v+"_"+arch.deb+".rpm")
			files := strings.Fields(string(run(t, "rpm", "-qlp", rpm)))
			checkFileList(t, files, append(common, "/etc/sysconfig/gpu-pod-exporter", "/usr/share/zsh/site-functions/_gpu-pod-exporter"),
				"/etc/default/gpu-pod-exporter")
			checkShippedDocLinks(t, "the .rpm", docsIn(files))
			if got := string(run(t, "rpm", "-qp", "--queryformat", "%{ARCH}", rpm)); got != arch.rpm {
				t.Errorf("rpm ARCH %q, want %s", got, arch.rpm)
			}
			if got := string(run(t, "rpm", "-qp", "--requires", rpm)); !strings.Contains(got, "glibc >= 2.34") {
				t.Errorf("the .rpm does not require glibc >= 2.34: %q", got)
			}
			if got := string(run(t, "rpm", "-qcp", rpm)); !strings.Contains(got, "/etc/sysconfig/gpu-pod-exporter") {
				t.Errorf("/etc/sysconfig/gpu-pod-exporter is not a %%config file: %q", got)
			}
			scripts := string(run(t, "rpm", "-qp", "--scripts", rpm))
			for _, src := range []string{"postinstall.sh", "preremove.sh", "postremove.sh"} {
				body := strings.TrimPrefix(string(readRepoFile(t, "packaging/"+src)), "#!/bin/sh\n")
				if !strings.Contains(scripts, strings.TrimSpace(body)) {
					t.Errorf("the .rpm's scripts lack packaging/%s:\n%s", src, scripts)
				}
			}
			root := t.TempDir()
			// The archive's names are absolute (/usr/bin/...): --no-absolute-filenames keeps them under root.
			extract := exec.Command("sh", "-c", `rpm2cpio "$1" | cpio -idm --quiet --no-absolute-filenames`, "sh", rpm)
			extract.Dir = root
			if out, err := extract.CombinedOutput(); err != nil {
				t.Fatalf("rpm2cpio | cpio: %v\n%s", err, out)
			}
			verifyInstalledUnit(t, root)
			verifyManPage(t, root, v)
		})
	}
}

// shippedDocs are the documents the archives and packages carry, relative to their documentation directory: the
// README and what it links, in the repository's layout.
var shippedDocs = []string{"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/reference.md", "docs/install.md",
	"docs/compat.md", "docs/accounting.md", "docs/faq.md", "docs/how-it-works.md", "docs/performance.md", "docs/top.png"}

// checkShippedDocLinks: every link of a shipped document to another document or image (.md, .png) resolves to a
// shipped file, so that the README read from /usr/share/doc leads to the guides. Links into the repository's
// sources (deploy/, scripts/) are the repository's, not the package's.
func checkShippedDocLinks(t *testing.T, what string, shipped []string) {
	t.Helper()
	for _, doc := range shipped {
		if !strings.HasSuffix(doc, ".md") {
			continue
		}
		for _, line := range proseLines(string(readRepoFile(t, doc))) {
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if target == "" || strings.Contains(target, "://") || !(strings.HasSuffix(target, ".md") || strings.HasSuffix(target, ".png")) {
					continue
				}
				if p := filepath.Clean(filepath.Join(filepath.Dir(doc), target)); !slices.Contains(shipped, p) {
					t.Errorf("%s: %s links to %s, which it does not ship", what, doc, p)
				}
			}
		}
	}
}

func checkFileList(t *testing.T, files, want []string, absent string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(files, w) {
			t.Errorf("the package lacks %s: %v", w, files)
		}
	}
	if slices.Contains(files, absent) {
		t.Errorf("the package holds %s", absent)
	}
}

// manPage is where the packages install the man page.
const manPage = "/usr/share/man/man1/gpu-pod-exporter.1.gz"

// verifyManPage: man renders the installed page without a warning, with the release's version in its footer.
func verifyManPage(t *testing.T, root, version string) {
	t.Helper()
	cmd := exec.Command("man", "-l", filepath.Join(root, manPage))
	cmd.Env = append(os.Environ(), "MANPAGER=cat", "MANWIDTH=80", "LC_ALL=C.UTF-8")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Errorf("man -l %s: %v\n%s", manPage, err, stderr.String())
	}
	if !strings.Contains(string(out), "gpu-pod-exporter "+version) || !strings.Contains(string(out), "--web.listen-address") {
		t.Errorf("the man page names no version %s, or no flag:\n%s", version, out)
	}
}

// verifyInstalledUnit runs systemd-analyze verify on the package's unit inside root, which holds the package's files
// and the host's own units to order against.
func verifyInstalledUnit(t *testing.T, root string) {
	t.Helper()
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is missing: apt-get install systemd (scripts/test.sh does)")
	}
	units := filepath.Join(root, "usr/lib/systemd/system")
	if _, err := os.Stat(filepath.Join(units, "gpu-pod-exporter.service")); err != nil {
		t.Fatalf("the package's unit is not at /usr/lib/systemd/system: %v", err)
	}
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(hostUnits, "multi-user.target")); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	if out, err := exec.Command("cp", "-an", hostUnits+"/.", units).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	out, err := exec.Command(sa, "verify", "--root="+root, "gpu-pod-exporter.service").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("systemd-analyze verify of the installed unit: %v\n%s", err, out)
	}
	// It fails without the packaged binary: the check reaches ExecStart.
	if err := os.Remove(filepath.Join(root, "usr/bin/gpu-pod-exporter")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sa, "verify", "--root="+root, "gpu-pod-exporter.service").CombinedOutput(); err == nil {
		t.Errorf("systemd-analyze verify passed without /usr/bin/gpu-pod-exporter:\n%s", out)
	}
}

// TestPackageScripts runs the maintainer scripts as dpkg and rpm call them, with systemd "running" (a private /run
// in a mount namespace) and a systemctl that records its arguments: install reloads systemd and never enables or
// starts the service; upgrade restarts it only if it runs; removal stops and disables it.
func TestPackageScripts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace with its own /run")
	}
	reload := "daemon-reload"
	restart := "try-restart gpu-pod-exporter.service"
	for _, tc := range []struct {
		name, script string
		args         []string
		want         []string
	}{
		{"deb install", "postinstall.sh", []string{"configure", ""}, []string{reload}},
		{"rpm install", "postinstall.sh", []string{"1"}, []string{reload}},
		{"deb upgrade", "postinstall.sh", []string{"configure", "0.1.0"}, []string{reload, restart}},
		{"rpm upgrade", "postinstall.sh", []string{"2"}, []string{reload, restart}},
		{"deb remove", "preremove.sh", []string{"remove"}, []string{"stop gpu-pod-exporter.service", "--no-reload disable gpu-pod-exporter.service"}},
		{"rpm erase", "preremove.sh", []string{"0"}, []string{"stop gpu-pod-exporter.service", "--no-reload disable gpu-pod-exporter.service"}},
		{"deb upgrade (old prerm)", "preremove.sh", []string{"upgrade", "0.2.0"}, nil},
		{"rpm upgrade (old preun)", "preremove.sh", []string{"1"}, nil},
		{"deb remove (postrm)", "postremove.sh", []string{"remove"}, []string{reload}},
		{"deb purge", "postremove.sh", []string{"purge"}, []string{reload}},
		{"rpm erase (postun)", "postremove.sh", []string{"0"}, []string{reload}},
		{"rpm upgrade (postun)", "postremove.sh", []string{"1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "systemctl.log")
			if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>'"+log+"'\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			script := filepath.Join(repoRoot(t), "packaging", tc.script)
			cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
				`mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && PATH="$0:$PATH" exec sh "$@"`, dir, script}, tc.args...)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s %q: %v\n%s", tc.script, tc.args, err, out)
			}
			b, _ := os.ReadFile(log)
			var got []string
			if s := strings.TrimSpace(string(b)); s != "" {
				got = strings.Split(s, "\n")
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s %q ran systemctl %q, want %q", tc.script, tc.args, got, tc.want)
			}
		})
	}
}

// TestMakeBuildVersion runs the command `make build` runs (make -n), writing elsewhere: --version shows the version,
// revision, branch, build user and build date it stamps.
func TestMakeBuildVersion(t *testing.T) {
	cmdline := strings.TrimSpace(string(run(t, "make", "-s", "-n", "build", "VERSION=9.9.9-make")))
	if strings.Count(cmdline, "\n") != 0 || !strings.Contains(cmdline, "-o gpu-pod-exporter ") {
		t.Fatalf("make -n build printed an unexpected command:\n%s", cmdline)
	}
	bin := filepath.Join(t.TempDir(), "gpu-pod-exporter")
	run(t, "sh", "-c", strings.Replace(cmdline, "-o gpu-pod-exporter ", "-o "+bin+" ", 1))
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	revision := strings.TrimSpace(string(run(t, "git", "rev-parse", "HEAD")))
	branch := strings.TrimSpace(string(run(t, "git", "rev-parse", "--abbrev-ref", "HEAD")))
	for _, want := range []string{"version 9.9.9-make (branch: " + branch + ", revision: " + revision + ")", "build user:       "} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--version lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`build user:\s+\S+@\S+`).Match(out) || !regexp.MustCompile(`build date:\s+20\d{6}-\d\d:\d\d:\d\d`).Match(out) {
		t.Errorf("--version lacks the build user or date:\n%s", out)
	}
}
