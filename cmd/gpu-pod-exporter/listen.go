package main

import (
	"errors"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/mdlayher/vsock"
	"github.com/prometheus/exporter-toolkit/web"
)

// listeners are the server's open sockets, opened before anything starts, so that a port taken is the one line
// the exporter prints.
type listeners struct {
	main   []net.Listener
	health net.Listener // nil without --web.health-listen-address
}

// open opens the listeners the flags name; an error names the flag.
func (f *webFlags) open() (listeners, error) {
	main, err := listen(f.toolkit)
	if err != nil {
		flag := "web.listen-address"
		if systemdSocket(f.toolkit) {
			flag = "web.systemd-socket"
		}
		return listeners{}, flagError(flag, "%v", err)
	}
	ls := listeners{main: main}
	if f.healthAddr != "" {
		if ls.health, err = net.Listen("tcp", f.healthAddr); err != nil {
			ls.close()
			return listeners{}, flagError("web.health-listen-address", "%v", err)
		}
	}
	return ls, nil
}

// close closes what open opened, for a start that fails after it.
func (ls listeners) close() {
	for _, l := range ls.main {
		l.Close()
	}
	if ls.health != nil {
		ls.health.Close()
	}
}

// checkListenAddress refuses a --web.listen-address that no listener can take: "9402" for ":9402", a port that is
// not a number.
func checkListenAddress(address string) error {
	if strings.HasPrefix(address, "vsock://") {
		if _, err := vsockPort(address); err != nil {
			return flagError("web.listen-address", "%q: %v (want vsock://:PORT)", address, err)
		}
		return nil
	}
	_, port, err := net.SplitHostPort(address)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err == nil {
		return nil
	}
	if _, nerr := strconv.ParseUint(address, 10, 16); nerr == nil {
		return flagError("web.listen-address", "%q is a port without a host: use :%s (every address) or HOST:%s", address, address, address)
	}
	return flagError("web.listen-address", "%q: %v (want HOST:PORT or :PORT)", address, err)
}

// systemdSocket reports --web.systemd-socket, which the toolkit offers on Linux only.
func systemdSocket(f *web.FlagConfig) bool { return f.WebSystemdSocket != nil && *f.WebSystemdSocket }

// listen opens the main listeners the toolkit's flags name, as its ListenAndServe would: systemd's sockets with
// --web.systemd-socket, else each --web.listen-address, on vsock for vsock://:PORT and TCP otherwise.
func listen(f *web.FlagConfig) ([]net.Listener, error) {
	if systemdSocket(f) {
		ls, err := activation.Listeners()
		if err != nil {
			return nil, err
		}
		if len(ls) == 0 {
			return nil, errors.New("no socket activation file descriptors found")
		}
		return ls, nil
	}
	var ls []net.Listener
	for _, address := range *f.WebListenAddresses {
		var l net.Listener
		var err error
		if strings.HasPrefix(address, "vsock://") {
			var port uint32
			if port, err = vsockPort(address); err == nil {
				l, err = vsock.Listen(port, nil)
			}
		} else {
			l, err = net.Listen("tcp", address)
		}
		if err != nil {
			for _, open := range ls {
				open.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func vsockPort(address string) (uint32, error) {
	u, err := url.Parse(address)
	if err != nil {
		return 0, err
	}
	_, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return 0, err
	}
	p, err := strconv.ParseUint(port, 10, 32)
	return uint32(p), err
}
