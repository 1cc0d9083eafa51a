// Package cgroup derives who owns a process from the contents of /proc/<pid>/cgroup: the Kubernetes pod and QoS
// class, the container and its runtime, the Slurm job, or the systemd unit.
//
// It reads nothing itself: Parse is a plain function over the file's text, so that it can be tested with real
// files from any host and fuzzed. The path layouts it understands are those written by the kubelet (cgroupfs and
// systemd drivers), runc and crun (for containerd, CRI-O, Docker and Podman), Podman pods, kind nodes, systemd
// (system and user managers, session scopes) and Slurm's cgroup/v1 and cgroup/v2 plugins. It works on the structure
// of the path segments (prefixes, suffixes, hex IDs, UUIDs) rather than on fixed layouts, because the same pieces
// are nested in many ways: a kind node is a Docker container holding a whole kubelet hierarchy, a cgroup namespace
// makes paths relative (/../..), and v1 controllers may each show a different path.
//
// The structure is anchored where it can be forged: a pod is read only under the kubelet's roots (a kubepods
// directory, or a systemd slice named after it), a Slurm job only under Slurm's root (slurm, slurm_<node>,
// slurmstepd.scope), and below a systemd user manager (user@<uid>.service, whose subtree is delegated to the user,
// who may create any cgroup there) only the user's own units and rootless Podman and Docker containers are read:
// never a pod, a Slurm job or a system service.
package cgroup

import "strings"

// Runtimes as Info.Runtime names them.
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "crio"
	RuntimeDocker     = "docker"
	RuntimePodman     = "podman"
)

// QoS classes as Info.QoS names them.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
)

// Info is what one cgroup file tells about its process. Every field is empty when unknown.
type Info struct {
	// Path is the cgroup path that the other fields were taken from: the most specific line of the file.
	Path string
	// Runtime is the runtime that created the container (RuntimeContainerd, …), when the path names it. Paths of
	// the cgroupfs driver carry only the bare ID, and then Runtime is empty.
	Runtime string
	// ContainerID is the innermost 64-hex container ID (lowercase).
	ContainerID string
	// OuterContainerID is set when the innermost container is nested in a pod's container (Docker-in-Docker in a
	// pod): it is the pod's container, which the CRI can name when it cannot name the inner one. Empty otherwise.
	OuterContainerID string
	// PodUID is the Kubernetes pod's UID in its API form: a dashed UUID, or 32 hex digits for a static pod.
	PodUID string
	// QoS is the pod's QoS class (QoSGuaranteed, …).
	QoS string
	// SlurmJobID is the Slurm job: a decimal job ID or a Slurm 26 SLUID.
	SlurmJobID string
	// SystemdUnit is the innermost .service or .scope unit, set only for a process in no container, pod or Slurm
	// job (for those the unit is the runtime's or slurmstepd's, not the workload's). A user manager's unit is
	// prefixed with the manager, "user@1000.service/foo.service", so that it is never taken for a system service.
	SystemdUnit string
	// UserManager is the systemd user manager ("user@1000.service") whose delegated subtree holds the path, empty
	// when there is none. The user named every cgroup below it: a container ID there is only a name the user chose,
	// which callers must not look up in the system's runtimes as if it were that container.
	UserManager string
}

// Parse reads the whole contents of /proc/<pid>/cgroup (cgroup v1, v2 or hybrid) and returns what the most specific
// of its paths tells. Lines it cannot read are skipped; it never fails, and an empty Info means that nothing is
// known.
//
// Each line is "hierarchy-ID:controller-list:path". In a hybrid or v1 file the lines may disagree (a v2 line of
// "/", a name=systemd line in a service, controllers in a container), so every path is parsed and the one naming
// the most is kept: a container outranks a pod, a pod a Slurm job, a job a systemd unit; among equals the deeper
// path, then the earlier line.
func Parse(content string) Info {
	var best Info
	bestRank := -1
	for content != "" {
		var line string
		line, content, _ = strings.Cut(content, "\n")
		line = strings.TrimSpace(line)
		// The path is everything after the second colon: it may itself contain colons (runc's systemd driver
		// writes "slice:prefix:id" into v1 paths).
		_, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		info := parsePath(path)
		if r := rank(info); r > bestRank {
			best, bestRank = info, r
		}
	}
	return best
}

// rank orders the paths of one file by how much they name, then by depth.
func rank(info Info) int {
	r := 0
	switch {
	case info.ContainerID != "":
		r = 4
	case info.PodUID != "":
		r = 3
	case info.SlurmJobID != "":
		r = 2
	case info.SystemdUnit != "":
		r = 1
	}
	depth := min(strings.Count(info.Path, "/"), 999)
	return r*1000 + depth
}

// parsePath reads one cgroup path from the root down, so that inner segments override outer ones: the innermost
// container wins in a kind node or a Podman pod.
func parsePath(path string) Info {
	info := Info{Path: path}
	var (
		at   where  // what the segments above the current token are
		unit string // innermost .service/.scope segment
	)
	rest := path
	for rest != "" {
		var seg string
		seg, rest, _ = strings.Cut(rest, "/")
		// Paths relative to a private cgroup namespace start with "/..": the segments that follow still parse.
		if seg == "" || seg == "." || seg == ".." {
			continue
		}
		if strings.HasSuffix(seg, ".service") || strings.HasSuffix(seg, ".scope") {
			unit = seg
		}
		if info.UserManager == "" && !named(info) && isUserManager(seg) {
			// Everything below is the user's to name; the first (outermost) manager is the real one. A manager
			// inside a pod, a container or a Slurm job (systemd run there) is part of that workload, which stays
			// the owner.
			info.UserManager = seg
			at.user = true
		}
		if !at.user && isSlurmSegment(seg) {
			at.slurm = true
		}
		// runc's systemd driver on cgroup v1 writes "kubepods-…-pod<uid>.slice:cri-containerd:<id>" as one
		// segment: its tokens read like segments of their own, the runtime name standing before the bare ID.
		for seg != "" {
			var tok string
			tok, seg, _ = strings.Cut(seg, ":")
			if tok == "" {
				continue
			}
			base := trimUnitSuffix(tok)
			parseToken(&info, base, at)
			at.prev2, at.prev = at.prev, base
		}
	}
	if !named(info) {
		info.SystemdUnit = unit
		if info.UserManager != "" && unit != info.UserManager {
			info.SystemdUnit = info.UserManager + "/" + unit
		}
	}
	if info.OuterContainerID == info.ContainerID {
		info.OuterContainerID = "" // the pod's container nested in itself further down: nothing outer to name
	}
	return info
}

// named reports whether the path so far names a workload: a container, a pod or a Slurm job.
func named(info Info) bool {
	return info.ContainerID != "" || info.PodUID != "" || info.SlurmJobID != ""
}

// where is what the path above a token tells.
type where struct {
	prev, prev2 string // the two tokens before, without a .slice/.scope suffix
	slurm       bool   // below a segment that Slurm created
	user        bool   // below a user manager: the user's delegated subtree
}

// parseToken applies what one path token names to info. base has its .slice/.scope suffix removed.
func parseToken(info *Info, base string, at where) {
	if id, runtime, ok := containerToken(base, at.prev); ok {
		if at.user && runtime != RuntimeDocker && runtime != RuntimePodman {
			return // only rootless Podman and Docker run containers in a user's subtree
		}
		if info.PodUID != "" && info.ContainerID != "" && info.OuterContainerID == "" && info.ContainerID != id {
			info.OuterContainerID = info.ContainerID // the pod's container, holding this one
		}
		info.ContainerID, info.Runtime = id, runtime
		return
	}
	if uid, qos, ok := podToken(base, at.prev, at.prev2); ok {
		if at.user {
			return // a user's cgroup named like a pod is not the kubelet's
		}
		// A container above the pod is the node that runs it (kind), not the pod's container.
		info.PodUID, info.QoS = uid, qos
		info.ContainerID, info.Runtime, info.OuterContainerID = "", "", ""
		return
	}
	// A job below a user manager is the user's cgroup named like one: Slurm's root above the manager does not make
	// it Slurm's.
	if job, ok := slurmJobToken(base, at.slurm && !at.user); ok {
		info.SlurmJobID = job
	}
}

// isUserManager reports whether a segment is a systemd user manager's unit, "user@<uid>.service".
func isUserManager(seg string) bool {
	uid, ok := strings.CutPrefix(seg, "user@")
	if !ok {
		return false
	}
	uid, ok = strings.CutSuffix(uid, ".service")
	return ok && isDecimal(uid)
}

// containerToken recognizes a container's cgroup: "<prefix>-<64 hex>" (systemd drivers and CRI-O/Podman's
// cgroupfs names) or a bare "<64 hex>" (cgroupfs), whose runtime is then told by the token before it ("/docker/<id>",
// ":cri-containerd:<id>"). Conmon's scope ("crio-conmon-<id>", "libpod-conmon-<id>") holds the monitor, not the
// container, and a Podman pod's slice ("machine-libpod_pod_<id>") holds containers: neither is a container.
func containerToken(base, prev string) (id, runtime string, ok bool) {
	if len(base) < 64 {
		return "", "", false
	}
	id = base[len(base)-64:]
	if !isLowerHex(id) {
		return "", "", false
	}
	prefix := base[:len(base)-64]
	if prefix == "" {
		return id, runtimeOf(prev), true
	}
	if sep := prefix[len(prefix)-1]; sep != '-' && sep != '_' {
		return "", "", false // a longer hex string or a word glued to the ID: not an ID
	}
	prefix = prefix[:len(prefix)-1]
	if strings.HasSuffix(prefix, "conmon") || strings.HasSuffix(prefix, "_pod") || strings.HasSuffix(prefix, "-pod") {
		return "", "", false
	}
	return id, runtimeOf(prefix), true
}

// runtimeOf names the runtime from the prefix of a container's scope or the directory above a bare ID.
func runtimeOf(prefix string) string {
	switch prefix {
	case "cri-containerd", "containerd", "nerdctl":
		return RuntimeContainerd
	case "crio", "cri-o":
		return RuntimeCRIO
	case "docker":
		return RuntimeDocker
	case "libpod", "podman":
		return RuntimePodman
	}
	return ""
}

// podToken recognizes a pod's cgroup under the kubelet's root: "pod<uid>" directly under "kubepods" or under
// "kubepods/<qos>" (cgroupfs), or "[<root>-]kubepods[-<qos>]-pod<uid with _>" (systemd driver, whose slice names
// spell out their parents; kind nodes prefix "kubelet-"). The QoS class comes from the name itself, or from the
// directory above; a pod directly under kubepods is Guaranteed. A pod<uid> anywhere else is not the kubelet's.
func podToken(base, prev, prev2 string) (uid, qos string, ok bool) {
	i := strings.LastIndex(base, "pod")
	if i < 0 || (i > 0 && base[i-1] != '-') {
		return "", "", false
	}
	uid, ok = normalizeUID(base[i+len("pod"):])
	if !ok {
		return "", "", false
	}
	if i > 0 {
		if qos = qosOf(base[:i-1]); qos == "" {
			return "", "", false
		}
		return uid, qos, true
	}
	switch {
	case (prev == "burstable" || prev == "besteffort") && qosOf(prev2) == QoSGuaranteed:
		return uid, prev, true // kubepods/<qos>/pod<uid>
	case qosOf(prev) != "":
		return uid, qosOf(prev), true
	}
	return "", "", false
}

// qosOf reads the QoS class from a name that ends in "kubepods" (Guaranteed) or "kubepods-<qos>".
func qosOf(name string) string {
	switch {
	case strings.HasSuffix(name, "kubepods"):
		return QoSGuaranteed
	case strings.HasSuffix(name, "kubepods-burstable"):
		return QoSBurstable
	case strings.HasSuffix(name, "kubepods-besteffort"):
		return QoSBestEffort
	}
	return ""
}

// normalizeUID returns a pod UID in the form the API shows: the systemd driver escapes "-" as "_". Static pods'
// UIDs are 32 hex digits (an MD5 of the manifest), all others dashed UUIDs.
func normalizeUID(s string) (string, bool) {
	switch len(s) {
	case 32:
		if IsHex(s) {
			return strings.ToLower(s), true
		}
	case 36:
		for i := range len(s) {
			c := s[i]
			switch i {
			case 8, 13, 18, 23:
				if c != '-' && c != '_' {
					return "", false
				}
			default:
				if !isHexByte(c) {
					return "", false
				}
			}
		}
		if strings.IndexByte(s, '_') < 0 && !hasUpper(s) {
			return s, true // already in API form: no allocation
		}
		return strings.ToLower(strings.ReplaceAll(s, "_", "-")), true
	}
	return "", false
}

// slurmJobToken recognizes Slurm's job cgroup below a Slurm segment: "job_<id>" with a decimal ID or a SLUID, or
// a bare SLUID, for hierarchies named by SLUID alone. Elsewhere (a CI runner's /system.slice/runner.service/job_42,
// a user's own cgroups) it is not a Slurm job, however it is spelled.
func slurmJobToken(base string, inSlurm bool) (string, bool) {
	if !inSlurm {
		return "", false
	}
	if id, ok := strings.CutPrefix(base, "job_"); ok {
		if isDecimal(id) || isSLUID(id) {
			return id, true
		}
		return "", false
	}
	if isSLUID(base) {
		return base, true
	}
	return "", false
}

// isSlurmSegment reports whether a segment is one that Slurm creates above its jobs: "slurm" (cgroup/v1),
// "slurm_<node>" (several slurmd per host), "slurmstepd.scope" (cgroup/v2).
func isSlurmSegment(seg string) bool {
	return seg == "slurm" || strings.HasPrefix(seg, "slurm_") || strings.HasPrefix(seg, "slurmstepd")
}

// isSLUID reports whether s is a Slurm 26 SLUID: "s" and 13 Crockford base32 digits (SchedMD's sluid2str writes
// e.g. "sBR1JB8J1YM400"; str2sluid reads both cases and O, I, L as 0, 1, 1). U is not in the alphabet.
func isSLUID(s string) bool {
	if len(s) != 14 || (s[0] != 's' && s[0] != 'S') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z' && c != 'u':
		case c >= 'A' && c <= 'Z' && c != 'U':
		default:
			return false
		}
	}
	return true
}

func trimUnitSuffix(s string) string {
	if t, ok := strings.CutSuffix(s, ".scope"); ok {
		return t
	}
	if t, ok := strings.CutSuffix(s, ".slice"); ok {
		return t
	}
	return s
}

func isDecimal(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isLowerHex(s string) bool {
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// IsHex reports whether s is a non-empty string of hex digits, as container, pod and sandbox IDs are. The runtime
// clients refuse anything else before it reaches a URL path.
func IsHex(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if !isHexByte(s[i]) {
			return false
		}
	}
	return true
}

func isHexByte(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func hasUpper(s string) bool {
	for i := range len(s) {
		if s[i] >= 'A' && s[i] <= 'Z' {
			return true
		}
	}
	return false
}
