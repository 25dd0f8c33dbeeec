package localfleet

import (
	"bytes"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// Proxy forwards TCP connections to a target until it is cut: then it drops
// every open connection and holds new ones open without forwarding, as a
// network partition looks to a client (calls hang until their timeouts).
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	// holdReleases: a connection that sends a lease release is held back,
	// its bytes queued, even after the client gives up, until DeliverHeld.
	holdReleases bool
	held         []*heldConn
}

// heldConn is a client's connection whose requests wait to be delivered.
type heldConn struct {
	up    net.Conn
	queue [][]byte
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held open, never answered, until Heal or Close drops it
		}
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.upstream(c, up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	p.drop(c)
	// A held connection's upstream stays open until DeliverHeld.
	p.mu.Lock()
	held := slices.ContainsFunc(p.held, func(h *heldConn) bool { return h.up == up })
	p.mu.Unlock()
	if !held {
		p.drop(up)
	}
}

// upstream copies the client's bytes to up until the client closes, unless
// a release is to be held: then it queues them instead.
func (p *Proxy) upstream(c, up net.Conn) {
	var h *heldConn
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := bytes.Clone(buf[:n])
			p.mu.Lock()
			if h == nil && p.holdReleases && bytes.Contains(chunk, []byte("/release HTTP")) {
				h = &heldConn{up: up}
				p.held = append(p.held, h)
			}
			if h != nil {
				h.queue = append(h.queue, chunk)
			}
			p.mu.Unlock()
			if h == nil {
				if _, werr := up.Write(chunk); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// HoldReleases makes the proxy hold back every lease release from now on,
// as a network or load balancer that delivers a request after its client
// has given up: the release's outcome is unknown to the agent, and it lands
// when DeliverHeld is called.
func (p *Proxy) HoldReleases(hold bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdReleases = hold
}

// Held counts the connections held back.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// DeliverHeld sends every held connection's requests to the target now.
func (p *Proxy) DeliverHeld() {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, h := range held {
		for _, chunk := range h.queue {
			_, _ = h.up.Write(chunk)
		}
		go func(up net.Conn) {
			_ = up.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, up)
			p.drop(up)
		}(h.up)
	}
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

// Cut partitions the client from the target.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Heal ends the partition; held connections are dropped so that clients
// reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Heal()
}
