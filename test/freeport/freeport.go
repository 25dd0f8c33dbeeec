// Package freeport finds TCP ports on 127.0.0.1 that are free, for servers
// that a test starts and must name a port for in advance (a webhook server, a
// child process's flags). A port is free when it is returned; another process
// may take it before the caller binds it, so callers that can listen on
// port 0 and read the address back should do that instead.
package freeport

import (
	"fmt"
	"net"
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

// Port returns one free port.
func Port() (int, error) {
	ports, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}
