#!/usr/bin/env bash
# Starts real container runtimes for the end-to-end tests: containerd (CRI), dockerd and the Podman API service,
# each with its own configuration, state and socket under $E2E_WORK, so that nothing of the host's own runtimes is
# touched. Idempotent: a daemon already running from an earlier call is reused.
#
# Needs root and a cgroup v1 or hybrid host (cgroupfs driver; no systemd). Installs Debian's packages if missing.
#
#   E2E_WORK   work directory (default /tmp/gpe-e2e)
#
# On success it writes $E2E_WORK/env, which the Go test and a shell can source:
#   GPE_E2E_CONTAINERD_SOCK, GPE_E2E_DOCKER_SOCK, GPE_E2E_PODMAN_SOCK, GPE_E2E_IMAGE, ...
# Undo with teardown-runtimes.sh.
set -euo pipefail

W="${E2E_WORK:-/tmp/gpe-e2e}"
IMAGE="gpe.local/busybox:e2e"
READY_TIMEOUT="${E2E_READY_TIMEOUT:-60}"
PACKAGES=(containerd runc docker.io podman busybox-static)

log() { echo "[setup-runtimes] $*" >&2; }

die() {
	log "ERROR: $*"
	for f in "$W"/logs/*.log; do
		[ -f "$f" ] || continue
		log "--- last 30 lines of $f ---"
		tail -n 30 "$f" >&2 || true
	done
	exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root"

mkdir -p "$W"/{logs,pids,cache,cni/bin,cni/conf}

# --- packages -----------------------------------------------------------------------------------------------------
install_packages() {
	local missing=()
	for p in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ "${#missing[@]}" = 0 ] && return 0
	log "installing ${missing[*]}"
	# Keep the packages' init scripts from starting the system's own daemons.
	local made_policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
		made_policy=1
	fi
	local rc=0
	{
		# Wait for another apt-get (a package manager run by hand, or a parallel test run) instead of failing.
		apt-get -o DPkg::Lock::Timeout=600 update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
	} >"$W/logs/apt.log" 2>&1 || rc=$?
	[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
	[ "$rc" = 0 ] || die "apt-get install ${missing[*]} failed (rc=$rc), see $W/logs/apt.log"
}
install_packages

# --- the busybox image ----------------------------------------------------------------------------------------------
# There is no registry: build a docker-archive (docker save format, which ctr, docker and podman all load) holding
# one layer with busybox-static and its applet links. Its command is a long sleep, so it also serves as the CRI
# sandbox ("pause") image.
build_image() {
	local out="$W/cache/busybox-image.tar"
	[ -s "$out" ] && return 0
	log "building $IMAGE archive"
	local b="$W/cache/build"
	rm -rf "$b"
	mkdir -p "$b/rootfs/bin" "$b/rootfs"/{etc,tmp,proc,sys,dev,root,var} "$b/archive"
	cp /bin/busybox "$b/rootfs/bin/busybox"
	local applet
	for applet in $(/bin/busybox --list); do
		[ "$applet" = busybox ] || ln -sf busybox "$b/rootfs/bin/$applet"
	done
	echo 'root:x:0:0:root:/root:/bin/sh' >"$b/rootfs/etc/passwd"
	echo 'root:x:0:' >"$b/rootfs/etc/group"
	chmod 1777 "$b/rootfs/tmp"
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$b/rootfs" -cf "$b/layer.tar" .
	local diff
	diff=$(sha256sum "$b/layer.tar" | cut -d' ' -f1)
	mkdir -p "$b/archive/$diff"
	mv "$b/layer.tar" "$b/archive/$diff/layer.tar"
	cat >"$b/config.json" <<-EOF
		{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",
		 "config":{"Env":["PATH=/bin"],"Cmd":["/bin/sleep","2147483647"],"WorkingDir":"/"},
		 "rootfs":{"type":"layers","diff_ids":["sha256:$diff"]},
		 "history":[{"created":"1970-01-01T00:00:00Z","created_by":"gpu-pod-exporter e2e: busybox-static"}]}
	EOF
	local cfg
	cfg=$(sha256sum "$b/config.json" | cut -d' ' -f1)
	mv "$b/config.json" "$b/archive/$cfg.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]\n' "$cfg" "$IMAGE" "$diff" \
		>"$b/archive/manifest.json"
	printf '{"%s":{"%s":"%s"}}\n' "${IMAGE%:*}" "${IMAGE##*:}" "$cfg" >"$b/archive/repositories"
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$b/archive" -cf "$out.tmp" .
	mv "$out.tmp" "$out"
	rm -rf "$b"
}
build_image
ARCHIVE="$W/cache/busybox-image.tar"

# --- helpers --------------------------------------------------------------------------------------------------------
alive() { # alive NAME: the daemon recorded in pids/NAME.pid runs
	local f="$W/pids/$1.pid" pid
	[ -s "$f" ] || return 1
	pid=$(cat "$f")
	kill -0 "$pid" 2>/dev/null
}

wait_for() { # wait_for WHAT NAME CMD...: poll CMD until it succeeds, the daemon dies or READY_TIMEOUT passes
	local what="$1" name="$2"
	shift 2
	local deadline=$((SECONDS + READY_TIMEOUT))
	until "$@" >/dev/null 2>&1; do
		alive "$name" || die "$what: $name exited (see $W/logs/$name.log)"
		[ "$SECONDS" -lt "$deadline" ] || die "$what: not ready after ${READY_TIMEOUT}s (see $W/logs/$name.log)"
		sleep 0.5
	done
}

start_daemon() { # start_daemon NAME CMD...: start CMD in the background, logging to logs/NAME.log
	local name="$1"
	shift
	log "starting $name"
	# setsid: own session, so the daemon survives the caller and is not hit by its terminal's signals.
	setsid "$@" >>"$W/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$W/pids/$name.pid"
}

# --- containerd (CRI) -----------------------------------------------------------------------------------------------
CTRD="$W/containerd"
CTRD_SOCK="$CTRD/containerd.sock"
mkdir -p "$CTRD"/{root,state,opt}
cat >"$CTRD/config.toml" <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"

[grpc]
  address = "$CTRD_SOCK"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMAGE"
  # No CAP_SYS_RESOURCE here: never lower a process's oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTRD/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$W/cni/bin"
    conf_dir = "$W/cni/conf"
EOF
if ! alive containerd; then
	rm -f "$CTRD_SOCK"
	start_daemon containerd containerd --config "$CTRD/config.toml"
fi
wait_for "containerd API" containerd ctr --address "$CTRD_SOCK" version

# --- dockerd --------------------------------------------------------------------------------------------------------
DK="$W/docker"
DOCKER_SOCK="$W/docker.sock"
mkdir -p "$DK"/{data,exec}
echo '{}' >"$DK/daemon.json"
if ! alive dockerd; then
	rm -f "$DOCKER_SOCK"
	start_daemon dockerd dockerd \
		--config-file "$DK/daemon.json" \
		--data-root "$DK/data" \
		--exec-root "$DK/exec" \
		--pidfile "$DK/dockerd.pid" \
		-H "unix://$DOCKER_SOCK" \
		--bridge=none --iptables=false --ip6tables=false --ip-masq=false \
		--exec-opt native.cgroupdriver=cgroupfs \
		--storage-driver=overlay2
fi
DOCKER=(docker -H "unix://$DOCKER_SOCK")
[ -x /usr/bin/docker ] && DOCKER=(/usr/bin/docker -H "unix://$DOCKER_SOCK")
wait_for "docker API" dockerd "${DOCKER[@]}" version

# --- podman API service -------------------------------------------------------------------------------------------
PM="$W/podman"
PODMAN_SOCK="$W/podman.sock"
mkdir -p "$PM"/{root,runroot,tmp,volumes,netconf}
cat >"$PM/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PM/root"
runroot = "$PM/runroot"
EOF
cat >"$PM/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"
cgroupns = "host"
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$PM/events.log"
tmp_dir = "$PM/tmp"
volume_path = "$PM/volumes"
static_dir = "$PM/root/libpod"
runtime = "runc"

[network]
network_backend = "cni"
network_config_dir = "$PM/netconf"
cni_plugin_dirs = ["$W/cni/bin"]
EOF
export CONTAINERS_CONF="$PM/containers.conf" CONTAINERS_STORAGE_CONF="$PM/storage.conf"
PODMAN=(podman --root "$PM/root" --runroot "$PM/runroot" --cgroup-manager cgroupfs --events-backend file)
if ! alive podman; then
	rm -f "$PODMAN_SOCK"
	start_daemon podman "${PODMAN[@]}" system service --time=0 "unix://$PODMAN_SOCK"
fi
wait_for "podman API" podman podman --url "unix://$PODMAN_SOCK" version

# --- the image in every runtime --------------------------------------------------------------------------------------
if ! ctr --address "$CTRD_SOCK" -n k8s.io images ls -q | grep -qxF "$IMAGE"; then
	log "importing $IMAGE into containerd"
	ctr --address "$CTRD_SOCK" -n k8s.io images import --all-platforms "$ARCHIVE" >>"$W/logs/import.log" 2>&1 ||
		die "ctr images import failed (see $W/logs/import.log)"
fi
if ! "${DOCKER[@]}" image inspect "$IMAGE" >/dev/null 2>&1; then
	log "loading $IMAGE into docker"
	"${DOCKER[@]}" load -i "$ARCHIVE" >>"$W/logs/import.log" 2>&1 || die "docker load failed (see $W/logs/import.log)"
fi
if ! podman --url "unix://$PODMAN_SOCK" image exists "$IMAGE" 2>/dev/null; then
	log "loading $IMAGE into podman"
	podman --url "unix://$PODMAN_SOCK" load -i "$ARCHIVE" >>"$W/logs/import.log" 2>&1 ||
		die "podman load failed (see $W/logs/import.log)"
fi

cat >"$W/env" <<EOF
GPE_E2E_WORK=$W
GPE_E2E_IMAGE=$IMAGE
GPE_E2E_CONTAINERD_SOCK=$CTRD_SOCK
GPE_E2E_CONTAINERD_CONFIG=$CTRD/config.toml
GPE_E2E_DOCKER_SOCK=$DOCKER_SOCK
GPE_E2E_PODMAN_SOCK=$PODMAN_SOCK
CONTAINERS_CONF=$PM/containers.conf
CONTAINERS_STORAGE_CONF=$PM/storage.conf
EOF
log "ready: containerd=$CTRD_SOCK docker=$DOCKER_SOCK podman=$PODMAN_SOCK image=$IMAGE (env in $W/env)"
