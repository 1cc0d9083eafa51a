package server

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/mdlayher/vsock"
)

// Listeners are the server's open sockets, opened before anything starts, so that a port taken is the one line
// the exporter prints.
type Listeners struct {
	Main   []net.Listener
	Health net.Listener // nil: probes are served on the main listeners only
}

// Close closes the listeners, for a start that fails before the server takes them.
func (ls Listeners) Close() {
	for _, l := range ls.Main {
		l.Close()
	}
	if ls.Health != nil {
		ls.Health.Close()
	}
}

// CheckListenAddress refuses a listen address that no listener can take: "9402" for ":9402", a port that is not a
// number.
func CheckListenAddress(address string) error {
	if strings.HasPrefix(address, "vsock://") {
		if _, err := vsockPort(address); err != nil {
			return fmt.Errorf("%q: %v (want vsock://:PORT)", address, err)
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
		return fmt.Errorf("%q is a port without a host: use :%s (every address) or HOST:%s", address, address, address)
	}
	return fmt.Errorf("%q: %v (want HOST:PORT or :PORT)", address, err)
}

// Listen opens the main listeners as exporter-toolkit's ListenAndServe would: systemd's sockets when systemdSocket,
// else one for each address, on vsock for vsock://:PORT and TCP otherwise.
func Listen(addresses []string, systemdSocket bool) ([]net.Listener, error) {
	if systemdSocket {
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
	for _, address := range addresses {
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
