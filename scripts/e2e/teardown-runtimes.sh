#!/usr/bin/env bash
# Undoes setup-runtimes.sh and whatever the e2e tests left behind: removes the containers through each runtime,
# stops the daemons by their recorded PIDs, ends leftover shims and container processes, unmounts what is mounted
# under $E2E_WORK, removes the e2e cgroup directories, and deletes $E2E_WORK except its image cache
# (E2E_KEEP_CACHE=0 removes that too). Safe to run twice, and after a setup that failed half way.
set -uo pipefail

W="${E2E_WORK:-/tmp/gpe-e2e}"
KEEP_CACHE="${E2E_KEEP_CACHE:-1}"

log() { echo "[teardown-runtimes] $*" >&2; }

[ -d "$W" ] || {
	log "nothing to do: $W does not exist"
	exit 0
}

CTRD_SOCK="$W/containerd/containerd.sock"
DOCKER_SOCK="$W/docker.sock"
PM="$W/podman"
DOCKER_BIN=docker
[ -x /usr/bin/docker ] && DOCKER_BIN=/usr/bin/docker

pid_alive() { kill -0 "$1" 2>/dev/null; }

stop_pid() { # stop_pid PID WHAT: SIGTERM, wait up to 15s, then SIGKILL
	local pid="$1" what="$2" i
	pid_alive "$pid" || return 0
	log "stopping $what (pid $pid)"
	kill -TERM "$pid" 2>/dev/null
	for i in $(seq 1 150); do
		pid_alive "$pid" || return 0
		sleep 0.1
	done
	log "$what (pid $pid) ignored SIGTERM, killing it"
	kill -KILL "$pid" 2>/dev/null
	for i in $(seq 1 50); do
		pid_alive "$pid" || return 0
		sleep 0.1
	done
}

daemon_alive() { [ -s "$W/pids/$1.pid" ] && pid_alive "$(cat "$W/pids/$1.pid")"; }

# 1. Containers, through the runtimes that made them (each bounded in time).
if daemon_alive containerd && [ -S "$CTRD_SOCK" ]; then
	log "removing CRI containers and sandboxes"
	for id in $(timeout 20 ctr --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
		timeout 20 ctr --address "$CTRD_SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1
	done
	for id in $(timeout 20 ctr --address "$CTRD_SOCK" -n k8s.io containers ls -q 2>/dev/null); do
		for i in 1 2 3 4 5 6 7 8 9 10; do
			timeout 20 ctr --address "$CTRD_SOCK" -n k8s.io tasks rm -f "$id" >/dev/null 2>&1 || true
			timeout 20 ctr --address "$CTRD_SOCK" -n k8s.io containers rm "$id" >/dev/null 2>&1 && break
			sleep 0.3
		done
	done
fi
if daemon_alive dockerd && [ -S "$DOCKER_SOCK" ]; then
	ids=$(timeout 20 "$DOCKER_BIN" -H "unix://$DOCKER_SOCK" ps -aq 2>/dev/null)
	if [ -n "$ids" ]; then
		log "removing docker containers"
		# shellcheck disable=SC2086
		timeout 60 "$DOCKER_BIN" -H "unix://$DOCKER_SOCK" rm -f $ids >/dev/null 2>&1
	fi
fi
if [ -f "$PM/containers.conf" ] && [ -f "$PM/storage.conf" ]; then
	# The local CLI with the same storage works without the API service.
	log "removing podman containers"
	CONTAINERS_CONF="$PM/containers.conf" CONTAINERS_STORAGE_CONF="$PM/storage.conf" \
		timeout 60 podman --root "$PM/root" --runroot "$PM/runroot" --cgroup-manager cgroupfs \
		--events-backend file rm -fa -t 0 >/dev/null 2>&1
fi

# 2. The daemons, by recorded PID.
for name in podman dockerd containerd; do
	f="$W/pids/$name.pid"
	[ -s "$f" ] && stop_pid "$(cat "$f")" "$name"
	rm -f "$f"
done

# 3. Leftovers: processes whose command line names the work directory (containerd shims, dockerd's containerd and
#    its shims, conmon) and the containers they ran, found through runc's state under the work directory.
for root in "$W/containerd/runc/k8s.io" "$W/docker/exec/runtime-runc/moby"; do
	[ -d "$root" ] || continue
	for id in $(runc --root "$root" list -q 2>/dev/null); do
		log "killing leftover container $id ($root)"
		runc --root "$root" kill "$id" KILL >/dev/null 2>&1
		runc --root "$root" delete -f "$id" >/dev/null 2>&1
	done
done
for p in /proc/[0-9]*; do
	pid="${p#/proc/}"
	[ "$pid" = "$$" ] && continue
	cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
	case "$cmd" in
	*"$W/"*) stop_pid "$pid" "leftover: ${cmd:0:120}" ;;
	esac
done

# 4. Mounts under the work directory, deepest first.
for i in 1 2 3; do
	mps=$(awk -v w="$W/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r | uniq)
	[ -z "$mps" ] && break
	for mp in $mps; do
		umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || log "could not unmount $mp"
	done
done

# 5. cgroup directories: those the e2e test made for host processes (listed in $W/cgroups as paths relative to each
#    hierarchy's root; their processes are ended first, their parents removed where empty), and the runtimes' parents
#    (kubepods, docker, libpod_parent), removed only where empty, so that nothing in use is touched.
rm_cgroup_tree() { # rm_cgroup_tree DIR KILL: rmdir DIR depth first; KILL=1 ends the processes in it first
	local d="$1" kill="$2" pid i
	[ -d "$d" ] || return 0
	if [ "$kill" = 1 ]; then
		for i in 1 2 3 4 5 6 7 8 9 10; do
			pids=$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
			[ -z "$pids" ] && break
			for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
			sleep 0.2
		done
	fi
	find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
}
hierarchies=$(awk '{ for (i = 7; i < NF; i++) if ($i == "-") { if ($(i+1) == "cgroup" || $(i+1) == "cgroup2") print $5; break } }' \
	/proc/self/mountinfo)
if [ -s "$W/cgroups" ]; then
	sort -u "$W/cgroups" | while read -r rel; do
		rel="${rel#/}"
		case "$rel" in "" | *..*) continue ;; esac
		for h in $hierarchies; do
			rm_cgroup_tree "$h/$rel" 1
			p="$rel"
			while [ "${p%/*}" != "$p" ]; do
				p="${p%/*}"
				rmdir "$h/$p" 2>/dev/null || break
			done
		done
	done
fi
for h in $hierarchies; do
	for d in kubepods docker libpod_parent; do rm_cgroup_tree "$h/$d" 0; done
done

# 6. The work directory.
if [ "$KEEP_CACHE" = 1 ]; then
	find "$W" -mindepth 1 -maxdepth 1 ! -name cache -exec rm -rf {} + 2>/dev/null
else
	rm -rf "$W" 2>/dev/null
fi
left=$(awk -v w="$W/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo)
[ -n "$left" ] && log "WARNING: still mounted: $left"
log "done"
exit 0
