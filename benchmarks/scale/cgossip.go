package main

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/cluster/gossip/gossiptest"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
)

// clusterGossip is N cluster.Memberships in gossip mode: liveness from
// package cluster/gossip, control connections dialed on first use (none
// on an idle cluster).
type clusterGossip struct {
	selves []config.NodeConfig // each node's own entry
	nodes  []*cluster.Membership
	nets   []*nodeNet
	gnets  []*countingGossip
	freeze *gossiptest.Freezer // of the last node
	downs  downLog
}

// startClusterGossip starts n nodes in gossip mode, paced at joinRate, and
// waits until every node knows every other. Each node's config lists the
// nodes started before it and itself on the ports they bound, and the
// later ones on ports picked at the start: in gossip mode the others learn
// a node's addresses from gossip.
func startClusterGossip(n int, timings *config.Config, converge time.Duration, joinRate float64) (*clusterGossip, error) {
	base := *timings
	base.Nodes = nil
	base.Membership = config.MembershipGossip
	base.Transport.SharedMemory = false
	c := &clusterGossip{freeze: new(gossiptest.Freezer)}
	// Gossip admits only the names a node's config lists (or discovery
	// announces): every config names all n nodes. The later nodes'
	// entries hold ports picked now, which may be taken by the time those
	// nodes start (they then bind others): the names are what counts, the
	// addresses come from gossip.
	later := make([]config.NodeConfig, n)
	for j := range n {
		var err error
		if later[j], err = freeNode(fmt.Sprintf("node%d", j)); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	for i := range n {
		if wait := time.Duration(float64(i)/joinRate*float64(time.Second)) - time.Since(t0); wait > 0 {
			time.Sleep(wait)
		}
		nn := &nodeNet{conns: map[*countingConn]struct{}{}, thaw: make(chan struct{})}
		cg := &countingGossip{}
		wrap := cg.wrap
		if i == n-1 {
			wrap = func(t memberlist.Transport) memberlist.Transport { return c.freeze.Wrap(cg.wrap(t)) }
		}
		var (
			m   *cluster.Membership
			cfg config.Config
			err error
		)
		for range 5 { // a picked port may be taken before the node binds it
			cfg = base
			var self config.NodeConfig
			if self, err = freeNode(fmt.Sprintf("node%d", i)); err != nil {
				continue
			}
			cfg.Nodes = append(append(append([]config.NodeConfig(nil), c.selves...), self), later[i+1:]...)
			if err = cfg.Validate(); err != nil {
				break
			}
			m, err = cluster.NewMembership(&cfg, self.Name, uint64(time.Now().UnixNano()), quietHandler{},
				cluster.Options{Network: nn, GossipTransport: wrap, SharedMemory: shm.Config{Disable: true},
					Logger: zap.New(&leaveCore{idx: i, downs: &c.downs})})
			if err != nil {
				break
			}
			if err = m.Start(); err == nil {
				break
			}
			m.Close()
			m = nil
		}
		if m == nil {
			c.close()
			return nil, err
		}
		c.nodes = append(c.nodes, m)
		c.nets = append(c.nets, nn)
		c.gnets = append(c.gnets, cg)
		c.selves = append(c.selves, cfg.Nodes[i])
	}
	deadline := time.Now().Add(converge)
	for _, m := range c.nodes {
		for len(m.Members()) < n-1 {
			if time.Now().After(deadline) {
				c.close()
				return nil, fmt.Errorf("gossip membership of %d: %s knows %d members after %v", n, m.Self().Name, len(m.Members()), converge)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return c, nil
}

// freeNode returns node name on loopback ports free now.
func freeNode(name string) (config.NodeConfig, error) {
	var addrs [3]string
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return config.NodeConfig{}, err
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return config.NodeConfig{Name: name, Address: addrs[0], DataAddress: addrs[1], GossipAddress: addrs[2]}, nil
}

func (c *clusterGossip) name(i int) string { return c.selves[i].Name }
func (c *clusterGossip) downLog() *downLog { return &c.downs }

// traffic returns what the nodes sent: gossip packets and streams, and
// writes on control and data connections.
func (c *clusterGossip) traffic() (msgs, bytes uint64) {
	for i := range c.nodes {
		msgs += c.nets[i].writes.Load() + c.gnets[i].msgs.Load()
		bytes += c.nets[i].bytes.Load() + c.gnets[i].bytes.Load()
	}
	return
}

// freezeNode freezes node i (the last one): its gossip and its
// connections stop answering, its sockets open.
func (c *clusterGossip) freezeNode(i int) {
	c.freeze.Freeze()
	c.nets[i].frozen.Store(true)
}

// kill closes node i's sockets at once: its gossip transport and its
// connections (the Membership is closed at the end).
func (c *clusterGossip) kill(i int) {
	c.gnets[i].kill()
	c.nets[i].kill()
}

func (c *clusterGossip) close() {
	c.freeze.Thaw()
	var wg sync.WaitGroup
	for i, m := range c.nodes {
		c.nets[i].unfreeze()
		wg.Go(func() { m.Close() })
	}
	wg.Wait()
}

// quietHandler is a no-op cluster.Handler: in gossip mode NodeDowns are
// taken from the membership's own view (leaveCore).
type quietHandler struct{ meshHandler }

func (quietHandler) PeerDown(*cluster.Peer, error) {}

// countingGossip wraps a node's gossip transport, counting what it sends.
type countingGossip struct {
	memberlist.NodeAwareTransport
	msgs, bytes atomic.Uint64
}

func (g *countingGossip) wrap(t memberlist.Transport) memberlist.Transport {
	g.NodeAwareTransport = t.(memberlist.NodeAwareTransport)
	return g
}

func (g *countingGossip) WriteTo(b []byte, addr string) (time.Time, error) {
	g.msgs.Add(1)
	g.bytes.Add(uint64(len(b)))
	return g.NodeAwareTransport.WriteTo(b, addr)
}

func (g *countingGossip) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	g.msgs.Add(1)
	g.bytes.Add(uint64(len(b)))
	return g.NodeAwareTransport.WriteToAddress(b, a)
}

func (g *countingGossip) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.count(g.NodeAwareTransport.DialTimeout(addr, timeout))
}

func (g *countingGossip) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return g.count(g.NodeAwareTransport.DialAddressTimeout(a, timeout))
}

func (g *countingGossip) count(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	g.msgs.Add(1)
	return &gossipStream{Conn: c, g: g}, nil
}

// kill shuts the transport: its sockets close under memberlist.
func (g *countingGossip) kill() { g.NodeAwareTransport.Shutdown() }

// gossipStream counts the bytes written on a gossip stream.
type gossipStream struct {
	net.Conn
	g *countingGossip
}

func (s *gossipStream) Write(p []byte) (int, error) {
	n, err := s.Conn.Write(p)
	s.g.bytes.Add(uint64(n))
	return n, err
}

// leaveCore is a zap core that logs, from a Membership's log, when it
// lets a member go ("member left": gossip's Leave, the membership's
// NodeDown): the detection the benchmark times. Every other entry is
// dropped.
type leaveCore struct {
	idx   int
	downs *downLog
}

func (c *leaveCore) Enabled(zapcore.Level) bool        { return true }
func (c *leaveCore) With([]zapcore.Field) zapcore.Core { return c }
func (c *leaveCore) Sync() error                       { return nil }
func (c *leaveCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "member left" {
		return ce.AddCore(e, c)
	}
	return nil
}

func (c *leaveCore) Write(_ zapcore.Entry, fs []zapcore.Field) error {
	for _, f := range fs {
		if f.Key == "peer" {
			c.downs.add(c.idx, f.String)
		}
	}
	return nil
}
