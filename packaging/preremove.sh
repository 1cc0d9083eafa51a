#!/bin/sh
# Before removal (deb: prerm remove; rpm: %preun 0), not before an upgrade: stop and disable the service.
case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl stop gpu-pod-exporter.service >/dev/null 2>&1 || :
	fi
	systemctl --no-reload disable gpu-pod-exporter.service >/dev/null 2>&1 || :
	;;
esac
exit 0
