package cgroup

import (
	"bufio"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// corpusCase is one line of testdata/cases.jsonl.
type corpusCase struct {
	Name   string `json:"name"`
	Cgroup string `json:"cgroup"`
	Expect struct {
		Runtime     string `json:"runtime"`
		ContainerID string `json:"container_id"`
		PodUID      string `json:"pod_uid"`
		QoS         string `json:"qos"`
		SlurmJobID  string `json:"slurm_job_id"`
		SystemdUnit string `json:"systemd_unit"`
		UserManager string `json:"user_manager"`
	} `json:"expect"`
	Source string `json:"source"`
}

// corpusFiles are the corpus: the project's shared cases, and the shapes of delegated and forged paths.
var corpusFiles = []string{"testdata/cases.jsonl", "testdata/delegated.jsonl"}

func loadCorpus(t testing.TB) []corpusCase {
	t.Helper()
	var cases []corpusCase
	for _, file := range corpusFiles {
		cases = append(cases, loadCorpusFile(t, file)...)
	}
	return cases
}

func loadCorpusFile(t testing.TB, file string) []corpusCase {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []corpusCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var c corpusCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatalf("%s is empty", file)
	}
	return cases
}

// fields drops Path, which the corpus does not state.
func fields(i Info) Info { i.Path = ""; return i }

func TestParseCorpus(t *testing.T) {
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			want := Info{
				Runtime: c.Expect.Runtime, ContainerID: c.Expect.ContainerID, PodUID: c.Expect.PodUID,
				QoS: c.Expect.QoS, SlurmJobID: c.Expect.SlurmJobID, SystemdUnit: c.Expect.SystemdUnit,
				UserManager: c.Expect.UserManager,
			}
			got := Parse(c.Cgroup)
			if fields(got) != want {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", c.Cgroup, fields(got), want)
			}
			if got.Path == "" {
				t.Errorf("Path is empty")
			}
		})
	}
}

const (
	id1  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	id2  = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	uid  = "2c9f8a79-5391-454b-88cb-86190881cb96"
	uidU = "2c9f8a79_5391_454b_88cb_86190881cb96"
)

// v1 replicates one path over the usual v1 controllers, with the v2 line of a hybrid host.
func v1(path string) string {
	var b strings.Builder
	for i, c := range []string{"name=systemd", "pids", "blkio", "freezer", "devices", "memory", "cpuset", "cpu,cpuacct"} {
		b.WriteString(strconv.Itoa(9-i) + ":" + c + ":" + path + "\n")
	}
	b.WriteString("0::/\n")
	return b.String()
}

func TestParseShapes(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  Info
	}{
		{
			name:  "crio cgroupfs",
			input: "0::/kubepods/burstable/pod" + uid + "/crio-" + id1 + "\n",
			want:  Info{Runtime: "crio", ContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			// Found by FuzzParse: systemd running inside a pod's container starts a user manager there.
			name:  "a user manager inside a pod's container is the pod's",
			input: "0::/kubepods/pod" + uid + "/crio-" + id1 + "/user.slice/user-0.slice/user@0.service/app.slice/x.service\n",
			want:  Info{Runtime: "crio", ContainerID: id1, PodUID: uid, QoS: "guaranteed"},
		},
		{
			name:  "a user manager inside a Slurm job is the job's",
			input: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/user@1000.service/a.service\n",
			want:  Info{SlurmJobID: "42"},
		},
		{
			name:  "crio conmon is not the container",
			input: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/crio-conmon-" + id1 + ".scope\n",
			want:  Info{PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "crio with crun's container subgroup",
			input: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/crio-" + id1 + ".scope/container\n",
			want:  Info{Runtime: "crio", ContainerID: id1, PodUID: uid, QoS: "besteffort"},
		},
		{
			name:  "cri-o prefix spelled with a dash",
			input: "0::/kubepods/pod" + uid + "/cri-o-" + id1 + "\n",
			want:  Info{Runtime: "crio", ContainerID: id1, PodUID: uid, QoS: "guaranteed"},
		},
		{
			name:  "containerd prefix without cri",
			input: "0::/system.slice/containerd-" + id1 + ".scope\n",
			want:  Info{Runtime: "containerd", ContainerID: id1},
		},
		{
			name:  "docker scope with a nested scope (systemd inside the container)",
			input: "0::/system.slice/docker-" + id1 + ".scope/init.scope\n",
			want:  Info{Runtime: "docker", ContainerID: id1},
		},
		{
			name: "kind node: kubelet hierarchy inside a docker container, v1",
			input: v1("/docker/" + id2 + "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/" +
				"kubelet-kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope"),
			want: Info{Runtime: "containerd", ContainerID: id1, PodUID: uid, QoS: "besteffort"},
		},
		{
			name:  "kind node, cgroupfs kubelet inside docker: the node's ID is not the pod's container",
			input: "0::/docker/" + id2 + "/kubepods/burstable/pod" + uid + "/" + id1 + "\n",
			want:  Info{ContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "kind node, process directly in the pod cgroup",
			input: "0::/docker/" + id2 + "/kubepods/burstable/pod" + uid + "\n",
			want:  Info{PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "private cgroup namespace, relative path",
			input: "0::/../../kubepods.slice/kubepods-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope\n",
			want:  Info{Runtime: "containerd", ContainerID: id1, PodUID: uid, QoS: "guaranteed"},
		},
		{
			name:  "podman pod, systemd: two IDs, the container is the inner one",
			input: "0::/machine.slice/machine-libpod_pod_" + id2 + ".slice/libpod-" + id1 + ".scope/container\n",
			want:  Info{Runtime: "podman", ContainerID: id1},
		},
		{
			name:  "podman pod, cgroupfs",
			input: v1("/libpod_parent/libpod-pod-" + id2 + "/libpod-" + id1),
			want:  Info{Runtime: "podman", ContainerID: id1},
		},
		{
			name:  "podman conmon is not the container",
			input: "0::/machine.slice/libpod-conmon-" + id1 + ".scope\n",
			want:  Info{SystemdUnit: "libpod-conmon-" + id1 + ".scope"},
		},
		{
			name:  "rootless podman under the user manager",
			input: "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + id1 + ".scope/container\n",
			want:  Info{Runtime: "podman", ContainerID: id1, UserManager: "user@1000.service"},
		},
		{
			name:  "rootless docker under the user manager",
			input: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker.service/docker/" + id1 + "\n",
			want:  Info{Runtime: "docker", ContainerID: id1, UserManager: "user@1000.service"},
		},
		{
			name:  "systemd user service: named with its manager, never taken for a system service",
			input: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service\n",
			want:  Info{SystemdUnit: "user@1000.service/foo.service", UserManager: "user@1000.service"},
		},
		{
			name:  "session scope",
			input: "0::/user.slice/user-1000.slice/session-3.scope\n",
			want:  Info{SystemdUnit: "session-3.scope"},
		},
		{
			name:  "service with a delegated subgroup",
			input: "0::/system.slice/vllm.service/workers\n",
			want:  Info{SystemdUnit: "vllm.service"},
		},
		{
			name:  "hybrid: v1 controllers in a service, v2 at the root",
			input: v1("/system.slice/ollama.service"),
			want:  Info{SystemdUnit: "ollama.service"},
		},
		{
			name: "hybrid: name=systemd in a service must not beat a controller naming a container",
			input: "12:name=systemd:/system.slice/docker.service\n" +
				"11:memory:/docker/" + id1 + "\n" +
				"10:cpu,cpuacct:/docker/" + id1 + "\n" +
				"0::/system.slice/docker.service\n",
			want: Info{Runtime: "docker", ContainerID: id1},
		},
		{
			name: "per-controller differences: pod cgroup in one, container in another",
			input: "3:cpuset:/kubepods/burstable/pod" + uid + "\n" +
				"2:memory:/kubepods/burstable/pod" + uid + "/" + id1 + "\n" +
				"0::/\n",
			want: Info{ContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "slurm v1 batch step with user subgroup",
			input: v1("/slurm/uid_1000/job_42/step_batch/user/task_0"),
			want:  Info{SlurmJobID: "42"},
		},
		{
			name:  "slurm v2 under slurmstepd.scope",
			input: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
			want:  Info{SlurmJobID: "42"},
		},
		{
			name:  "slurm with several slurmd per host",
			input: v1("/slurm_node07/uid_1000/job_4242/step_0/task_1"),
			want:  Info{SlurmJobID: "4242"},
		},
		{
			name:  "slurm 26 SLUID in the job segment",
			input: "0::/system.slice/slurmstepd.scope/job_sBR1JB8J1YM400/step_0/user/task_0\n",
			want:  Info{SlurmJobID: "sBR1JB8J1YM400"},
		},
		{
			name:  "slurm 26 bare SLUID below slurmstepd",
			input: "0::/system.slice/slurmstepd.scope/sBR1JB8J1YM400/step_0/user/task_0\n",
			want:  Info{SlurmJobID: "sBR1JB8J1YM400"},
		},
		{
			name:  "slurmstepd itself: job-level cgroup for the step daemon",
			input: "0::/system.slice/slurmstepd.scope/job_7/step_extern/slurm\n",
			want:  Info{SlurmJobID: "7"},
		},
		{
			name:  "slurmd's own scope is a unit, not a job",
			input: "0::/system.slice/slurmstepd.scope/system\n",
			want:  Info{SystemdUnit: "slurmstepd.scope"},
		},
		{
			name:  "static pod: 32-hex UID",
			input: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6e2c0a7f9b3d4e1a8c5f2b7d9e0a1c3b.slice/cri-containerd-" + id1 + ".scope\n",
			want:  Info{Runtime: "containerd", ContainerID: id1, PodUID: "6e2c0a7f9b3d4e1a8c5f2b7d9e0a1c3b", QoS: "burstable"},
		},
		{
			name:  "pod-level cgroup (pause or a process placed in the pod)",
			input: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice\n",
			want:  Info{PodUID: uid, QoS: "besteffort"},
		},
		{
			name:  "containerd colon form, guaranteed",
			input: v1("/kubepods.slice/kubepods-pod" + uidU + ".slice:cri-containerd:" + id1),
			want:  Info{Runtime: "containerd", ContainerID: id1, PodUID: uid, QoS: "guaranteed"},
		},
		{
			name:  "crio colon form",
			input: v1("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice:crio:" + id1),
			want:  Info{Runtime: "crio", ContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "docker inside a kubelet pod (dockershim cgroupfs)",
			input: v1("/kubepods/besteffort/pod" + uid + "/" + id1),
			want:  Info{ContainerID: id1, PodUID: uid, QoS: "besteffort"},
		},
		{
			name:  "process at the root",
			input: "0::/\n",
			want:  Info{},
		},
		{
			name:  "init",
			input: "0::/init.scope\n",
			want:  Info{SystemdUnit: "init.scope"},
		},
		{
			name:  "empty file",
			input: "",
			want:  Info{},
		},
		{
			name:  "uppercase or overlong hex is not a container ID",
			input: "0::/system.slice/docker-" + strings.ToUpper(id1) + ".scope/x" + id1 + "\n",
			want:  Info{SystemdUnit: "docker-" + strings.ToUpper(id1) + ".scope"},
		},
		{
			name:  "unknown runtime prefix still yields the ID",
			input: "0::/actions_job/" + id1 + "\n",
			want:  Info{ContainerID: id1},
		},
		{
			name:  "CRLF and surrounding blanks",
			input: "\r\n  0::/system.slice/docker-" + id1 + ".scope\r\n",
			want:  Info{Runtime: "docker", ContainerID: id1},
		},
		{
			name:  "job_ that is not a Slurm ID",
			input: "0::/system.slice/job_runner.service\n",
			want:  Info{SystemdUnit: "job_runner.service"},
		},
		{
			name:  "decimal job_ outside any Slurm segment is not a Slurm job",
			input: "0::/system.slice/jobs-runner.service/job_42\n",
			want:  Info{SystemdUnit: "jobs-runner.service"},
		},
		{
			name:  "decimal job_ under a user's slice is not a Slurm job",
			input: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_7\n",
			want:  Info{SystemdUnit: "user@1000.service", UserManager: "user@1000.service"},
		},
		{
			name:  "slurm v1 uid_/job_ shape under a root of another name is not Slurm's",
			input: v1("/hpc/uid_1000/job_42/step_0/task_0"),
			want:  Info{},
		},
		{
			name:  "slurm SLUID in a job_ segment outside Slurm's root is not a job",
			input: "0::/job_sBR1JB8J1YM400/step_0\n",
			want:  Info{},
		},
		{
			name:  "docker-in-docker in a pod: the innermost ID, and the pod's container as the outer one",
			input: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope/docker/" + id2 + "\n",
			want:  Info{Runtime: "docker", ContainerID: id2, OuterContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "a user manager nested in a user's subtree is the user's cgroup: the outer one counts",
			input: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/user@0.service/system.slice/sshd.service\n",
			want:  Info{SystemdUnit: "user@1000.service/sshd.service", UserManager: "user@1000.service"},
		},
		{
			name:  "containerd and CRI-O containers are never rootless: below a user manager they are the user's units",
			input: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/crio-" + id1 + ".scope\n",
			want:  Info{SystemdUnit: "user@1000.service/crio-" + id1 + ".scope", UserManager: "user@1000.service"},
		},
		{
			name:  "a systemd pod slice that does not spell out kubepods is not the kubelet's",
			input: "0::/system.slice/foo-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope\n",
			want:  Info{Runtime: "containerd", ContainerID: id1},
		},
		{
			name:  "a session scope is logind's, not the user's: not delegated",
			input: "0::/user.slice/user-1000.slice/session-3.scope/kubepods/burstable/pod" + uid + "/" + id1 + "\n",
			want:  Info{ContainerID: id1, PodUID: uid, QoS: "burstable"},
		},
		{
			name:  "docker-in-docker outside a pod has no outer container",
			input: "0::/system.slice/docker-" + id1 + ".scope/docker/" + id2 + "\n",
			want:  Info{Runtime: "docker", ContainerID: id2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Parse(tt.input)
			if fields(got) != tt.want {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", tt.input, fields(got), tt.want)
			}
		})
	}
}

func TestParsePathIsTheChosenLine(t *testing.T) {
	in := "12:name=systemd:/system.slice/docker.service\n11:memory:/docker/" + id1 + "\n0::/\n"
	if got := Parse(in).Path; got != "/docker/"+id1 {
		t.Errorf("Path = %q, want the line naming the container", got)
	}
}

var (
	reContainerID = regexp.MustCompile(`^[0-9a-f]{64}$`)
	rePodUID      = regexp.MustCompile(`^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
)

func FuzzParse(f *testing.F) {
	for _, c := range loadCorpus(f) {
		f.Add(c.Cgroup)
	}
	f.Add("0::/../../kubepods.slice/kubepods-pod" + uidU + ".slice:cri-containerd:" + id1)
	f.Add("0::/system.slice/slurmstepd.scope/job_sBR1JB8J1YM400/step_0")
	f.Add("1:a:b:c:d\n::\n:\n0::/pod/" + id1 + "-" + id2)
	f.Fuzz(func(t *testing.T, s string) {
		info := Parse(s)
		if info.ContainerID != "" && !reContainerID.MatchString(info.ContainerID) {
			t.Errorf("container ID %q is not 64 lowercase hex", info.ContainerID)
		}
		if info.PodUID != "" && !rePodUID.MatchString(info.PodUID) {
			t.Errorf("pod UID %q is not a dashed UUID or a static pod's 32 hex", info.PodUID)
		}
		if info.SystemdUnit != "" && (info.ContainerID != "" || info.PodUID != "" || info.SlurmJobID != "") {
			t.Errorf("systemd unit %q set with a container, pod or job: %+v", info.SystemdUnit, info)
		}
		if info.QoS != "" && info.PodUID == "" {
			t.Errorf("QoS %q without a pod: %+v", info.QoS, info)
		}
		if info.OuterContainerID != "" && (info.ContainerID == "" || info.PodUID == "" ||
			info.OuterContainerID == info.ContainerID || !reContainerID.MatchString(info.OuterContainerID)) {
			t.Errorf("outer container %q without a distinct inner container in a pod: %+v", info.OuterContainerID, info)
		}
		if info.Runtime != "" && info.ContainerID == "" {
			t.Errorf("runtime %q without a container: %+v", info.Runtime, info)
		}
		if info.UserManager != "" {
			if info.PodUID != "" || info.SlurmJobID != "" {
				t.Errorf("a pod or Slurm job below a user manager: %+v", info)
			}
			if info.ContainerID != "" && info.Runtime != RuntimeDocker && info.Runtime != RuntimePodman {
				t.Errorf("a container below a user manager that is not rootless Podman or Docker: %+v", info)
			}
			if info.SystemdUnit != "" && info.SystemdUnit != info.UserManager && !strings.HasPrefix(info.SystemdUnit, info.UserManager+"/") {
				t.Errorf("a unit below a user manager not named with it: %+v", info)
			}
		}
		if info.Path != "" && !strings.Contains(s, info.Path) {
			t.Errorf("Path %q is not in the input", info.Path)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	inputs := map[string]string{
		"v2-systemd": "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidU + ".slice/cri-containerd-" + id1 + ".scope\n",
		"v1-hybrid":  v1("/kubepods/burstable/pod" + uid + "/" + id1),
	}
	for name, in := range inputs {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if Parse(in).ContainerID != id1 {
					b.Fatal("wrong container")
				}
			}
		})
	}
}
