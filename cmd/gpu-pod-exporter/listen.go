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

// listen opens the main listeners the toolkit's flags name, as its ListenAndServe would: systemd's sockets with
// --web.systemd-socket, else each --web.listen-address, on vsock for vsock://:PORT and TCP otherwise.
func listen(f *web.FlagConfig) ([]net.Listener, error) {
	if f.WebSystemdSocket != nil && *f.WebSystemdSocket {
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
