#!/bin/sh
# After install or upgrade (deb: postinst configure [<old version>]; rpm: %post <installed count>). Makes systemd see
# the unit, and restarts the service after an upgrade only if it was running. It never enables or starts it: that is
# the administrator's `systemctl enable --now gpu-pod-exporter`.
upgrade=0
case "$1" in
configure) [ -z "$2" ] || upgrade=1 ;;
[0-9]*) [ "$1" -lt 2 ] || upgrade=1 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$upgrade" = 1 ]; then
		systemctl try-restart gpu-pod-exporter.service >/dev/null 2>&1 || :
	fi
fi
exit 0
