package freeport_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/berthfleet/berth/test/freeport"
)

func TestPortsAreDistinctAndFree(t *testing.T) {
	ports, err := freeport.Ports(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		_ = l.Close()
	}
}

func TestPortsExceptLeavesTakenOut(t *testing.T) {
	taken, err := freeport.Ports(3)
	if err != nil {
		t.Fatal(err)
	}
	// The taken ports are closed again: a new call may find them free.
	ports, err := freeport.PortsExcept(4, taken...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 4 {
		t.Fatalf("PortsExcept(4) returned %v", ports)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		for _, x := range taken {
			if p == x {
				t.Errorf("port %d was taken: %v", p, taken)
			}
		}
		if seen[p] {
			t.Errorf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
	}
}
