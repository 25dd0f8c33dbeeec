// Package freeport finds TCP ports on 127.0.0.1 that are free, for servers
// that a test starts and must name a port for in advance (a webhook server, a
// child process's flags). A port is free when it is returned; another process
// may take it before the caller binds it, so callers that can listen on
// port 0 and read the address back should do that instead.
package freeport

import (
	"fmt"
	"net"
	"slices"
)

// Ports returns n distinct free ports. It holds all of them open until it has
// all, so that it cannot return one twice.
func Ports(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// PortsExcept returns n distinct free ports, none of them in taken (ports
// found earlier for the same process, which another call could return again
// once they were closed).
func PortsExcept(n int, taken ...int) ([]int, error) {
	ports, err := Ports(n + len(taken))
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, n)
	for _, p := range ports {
		if len(out) < n && !slices.Contains(taken, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Port returns one free port.
func Port() (int, error) {
	ports, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}
