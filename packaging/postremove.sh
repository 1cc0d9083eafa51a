#!/bin/sh
# After removal (deb: postrm remove|purge; rpm: %postun 0): make systemd forget the unit.
case "$1" in
remove | purge | 0)
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null 2>&1 || :
	fi
	;;
esac
exit 0
