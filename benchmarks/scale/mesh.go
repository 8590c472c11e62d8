package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
)

// meshCluster is N cluster.Memberships in a full mesh.
type meshCluster struct {
	cfg   *config.Config
	nodes []*cluster.Membership
	nets  []*nodeNet
	downs downLog
}

// meshHandler is a no-op cluster.Handler that logs downs.
type meshHandler struct {
	idx   int
	downs *downLog
}

func (h meshHandler) PeerUp(*cluster.Peer)                          {}
func (h meshHandler) PeerDown(p *cluster.Peer, _ error)             { h.downs.add(h.idx, p.Name) }
func (h meshHandler) HandleFrame(*cluster.Peer, wire.Frame)         {}
func (h meshHandler) HandleDataConn(_ string, _ string, c net.Conn) { c.Close() }

// startMesh starts n nodes with cfg's timings on loopback and waits until
// every node has every other up.
func startMesh(n int, timings *config.Config, converge time.Duration) (*meshCluster, error) {
	cfg, err := config.LocalConfig("scale", n)
	if err != nil {
		return nil, err
	}
	cfg.Membership = config.MembershipMesh
	cfg.HeartbeatInterval, cfg.FailureTimeout = timings.HeartbeatInterval, timings.FailureTimeout
	cfg.DialTimeout, cfg.ReconnectMin, cfg.ReconnectMax = timings.DialTimeout, timings.ReconnectMin, timings.ReconnectMax
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &meshCluster{cfg: cfg}
	for i, nc := range cfg.Nodes {
		nn := &nodeNet{conns: map[*countingConn]struct{}{}, thaw: make(chan struct{})}
		m, err := cluster.NewMembership(cfg, nc.Name, uint64(time.Now().UnixNano()), meshHandler{i, &c.downs},
			cluster.Options{Network: nn, SharedMemory: shm.Config{Disable: true}})
		if err != nil {
			c.close()
			return nil, err
		}
		if err := m.Start(); err != nil {
			c.close()
			return nil, err
		}
		c.nodes = append(c.nodes, m)
		c.nets = append(c.nets, nn)
	}
	deadline := time.Now().Add(converge)
	for _, m := range c.nodes {
		for len(m.Peers()) < n-1 {
			if time.Now().After(deadline) {
				c.close()
				return nil, fmt.Errorf("mesh of %d: %s has %d peers up after %v", n, m.Self().Name, len(m.Peers()), converge)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return c, nil
}

func (c *meshCluster) name(i int) string { return c.cfg.Nodes[i].Name }

// traffic returns the writes (messages on the wire) and bytes the nodes
// sent so far.
func (c *meshCluster) traffic() (msgs, bytes uint64) {
	for _, nn := range c.nets {
		msgs += nn.writes.Load()
		bytes += nn.bytes.Load()
	}
	return
}

func (c *meshCluster) downLog() *downLog { return &c.downs }

// freeze makes node i stop reading and writing, its sockets open.
func (c *meshCluster) freezeNode(i int) { c.nets[i].frozen.Store(true) }

// kill closes every socket of node i at once, as the kernel does for a
// killed process (the Membership is closed at the end).
func (c *meshCluster) kill(i int) { c.nets[i].kill() }

func (c *meshCluster) close() {
	var wg sync.WaitGroup
	for i, m := range c.nodes {
		c.nets[i].unfreeze()
		wg.Go(func() { m.Close() })
	}
	wg.Wait()
}

// nodeNet is one node's Network: TCP, counting what the node writes, able
// to freeze or kill the node.
type nodeNet struct {
	writes, bytes atomic.Uint64
	frozen        atomic.Bool

	mu     sync.Mutex
	conns  map[*countingConn]struct{}
	lns    []net.Listener
	thaw   chan struct{} // closed when the node is unfrozen
	thawed bool
	killed bool
}

func (n *nodeNet) Listen(address string) (net.Listener, error) {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.lns = append(n.lns, l)
	n.mu.Unlock()
	return &countingListener{Listener: l, n: n}, nil
}

func (n *nodeNet) DialContext(ctx context.Context, address string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	return n.track(c), nil
}

func (n *nodeNet) track(c net.Conn) net.Conn {
	cc := &countingConn{Conn: c, n: n}
	n.mu.Lock()
	if n.killed {
		n.mu.Unlock()
		c.Close()
		return cc
	}
	n.conns[cc] = struct{}{}
	n.mu.Unlock()
	return cc
}

func (n *nodeNet) kill() {
	n.mu.Lock()
	n.killed = true
	conns, lns := n.conns, n.lns
	n.conns = map[*countingConn]struct{}{}
	n.mu.Unlock()
	for _, l := range lns {
		l.Close()
	}
	for c := range conns {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as for a killed process
		}
		c.Conn.Close()
	}
}

func (n *nodeNet) unfreeze() {
	n.frozen.Store(false)
	n.mu.Lock()
	if !n.thawed {
		n.thawed = true
		close(n.thaw)
	}
	n.mu.Unlock()
}

// hold blocks a frozen node's reads and writes until it is unfrozen.
func (n *nodeNet) hold() {
	if n.frozen.Load() {
		<-n.thaw
	}
}

type countingListener struct {
	net.Listener
	n *nodeNet
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.n.track(c), nil
}

type countingConn struct {
	net.Conn
	n *nodeNet
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.n.hold()
	k, err := c.Conn.Read(p)
	c.n.hold() // what arrived while frozen is not read
	return k, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.n.hold()
	k, err := c.Conn.Write(p)
	c.n.writes.Add(1)
	c.n.bytes.Add(uint64(k))
	return k, err
}

func (c *countingConn) Close() error {
	c.n.mu.Lock()
	delete(c.n.conns, c)
	c.n.mu.Unlock()
	return c.Conn.Close()
}
