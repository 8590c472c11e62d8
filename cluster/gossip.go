package cluster

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tensorferry/tensorferry/cluster/gossip"
	"github.com/tensorferry/tensorferry/config"
	"go.uber.org/zap"
)

// Gossip membership: who is alive comes from package gossip (SWIM over
// hashicorp/memberlist, seeded from the config's node list), not from
// heartbeats on a control connection to every node. A member's Join makes
// it known (its addresses and incarnation); the first message to it dials
// (ondemand.go); its Leave (dead after suspicion, left, or restarted)
// takes its Peer down, with everything that hangs on that.

// gossipEvents adapts Membership to gossip.Events.
type gossipEvents Membership

func (e *gossipEvents) Join(g gossip.Member)              { (*Membership)(e).memberJoin(g) }
func (e *gossipEvents) Leave(g gossip.Member, why string) { (*Membership)(e).memberLeave(g, why) }

// startGossip starts this node's gossip and joins it to the config's other
// nodes, in the background until one answers.
func (m *Membership) startGossip() error {
	g, err := gossip.Start(gossip.Config{
		Cluster: m.cfg.Cluster,
		Secret:  m.cfg.Secret,
		Self: gossip.Member{Name: m.self.Name, Incarnation: m.incarnation,
			Address: m.self.Address, DataAddress: m.self.DataAddress, GossipAddress: m.self.GossipAddress},
		Gossip:    m.cfg.Gossip,
		Logger:    m.baseLog, // gossip names the node itself
		Transport: m.opts.GossipTransport,
	}, (*gossipEvents)(m))
	if err != nil {
		return fmt.Errorf("cluster: gossip: %w", err)
	}
	m.mu.Lock()
	m.gossip = g
	m.mu.Unlock()
	var seeds []string
	for _, n := range m.cfg.Nodes {
		if n.Name != m.self.Name && !n.MeshOnly {
			seeds = append(seeds, n.GossipAddress)
		}
	}
	if len(seeds) > 0 {
		m.wg.Add(1)
		go m.joinLoop(seeds)
	}
	return nil
}

// joinLoop joins the gossip through seeds, retrying with backoff until one
// of them answers: the first node of a cluster starts alone.
func (m *Membership) joinLoop(seeds []string) {
	defer m.wg.Done()
	backoff := m.cfg.ReconnectMin
	for {
		n, err := m.gossip.Join(seeds)
		if n > 0 {
			m.log.Debug("joined the gossip", zap.Int("seeds_answered", n))
			return
		}
		m.log.Debug("no seed answered", zap.Strings("seeds", seeds), zap.Error(err))
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-t.C:
		case <-m.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, m.cfg.ReconnectMax)
	}
}

// memberJoin makes g known: its addresses and incarnation. A Peer of an
// older incarnation goes down (its node restarted).
func (m *Membership) memberJoin(g gossip.Member) {
	if g.Name == m.self.Name {
		return
	}
	_, inConfig := m.cfg.Node(g.Name)
	m.mu.Lock()
	_, announced := m.seeds[g.Name]
	if !inConfig && m.cfg.Discovery == nil {
		// With a static node list only the config's nodes are members:
		// a holder of the secret cannot add names (and connections).
		m.mu.Unlock()
		if m.unknownWarn.Allow() {
			m.log.Warn("gossip announces a node that is not in the config: ignored", zap.String("peer", g.Name))
		}
		return
	}
	s := m.slots[g.Name]
	if s != nil && s.mesh {
		// A mesh_only node does not gossip: its connection, not gossip,
		// says whether it is up.
		m.mu.Unlock()
		if m.unknownWarn.Allow() {
			m.log.Warn("gossip announces a node of the config that is mesh_only: ignored", zap.String("peer", g.Name))
		}
		return
	}
	if s == nil {
		s = &slot{changed: make(chan struct{})}
		// With discovery, a name the source has not announced (yet)
		// waits for it, as a node it reported gone does (discovered).
		s.evicted = !inConfig && !announced
		m.slots[g.Name] = s
	}
	if g.Incarnation < max(s.highest, s.inc) {
		m.mu.Unlock()
		m.log.Warn("gossip reports an older incarnation: ignored", zap.String("peer", g.Name),
			zap.Uint64("incarnation", g.Incarnation), zap.Uint64("live_incarnation", max(s.highest, s.inc)))
		return
	}
	s.cfg = config.NodeConfig{Name: g.Name, Address: g.Address, DataAddress: g.DataAddress, GossipAddress: g.GossipAddress}
	s.gossipAlive, s.inc = true, g.Incarnation
	s.alive = !s.evicted
	old := s.cur
	if old != nil && old.Incarnation == g.Incarnation {
		old = nil
	}
	s.signal()
	close(m.joined)
	m.joined = make(chan struct{})
	m.mu.Unlock()
	m.log.Debug("member joined", zap.String("peer", g.Name), zap.Uint64("incarnation", g.Incarnation))
	if old != nil {
		m.dropPeer(old, fmt.Errorf("%w: restarted as incarnation %d", ErrNodeDown, g.Incarnation))
	}
}

// memberLeave ends g: its Peer goes down with why.
func (m *Membership) memberLeave(g gossip.Member, why string) {
	m.mu.Lock()
	s := m.slots[g.Name]
	if s == nil || s.mesh || g.Incarnation < s.inc {
		m.mu.Unlock()
		return // an older incarnation, already replaced; or mesh_only (memberJoin)
	}
	s.alive, s.gossipAlive = false, false
	p := s.cur
	s.signal()
	m.mu.Unlock()
	m.log.Debug("member left", zap.String("peer", g.Name), zap.Uint64("incarnation", g.Incarnation), zap.String("reason", why))
	if p != nil && p.Incarnation <= g.Incarnation {
		m.dropPeer(p, fmt.Errorf("%w: %s", ErrNodeDown, why))
	}
	m.mu.Lock()
	if s := m.slots[g.Name]; s != nil {
		m.forgetIfGone(s)
	}
	m.mu.Unlock()
}

// Members returns the nodes known alive now, this one excluded: the
// config's other nodes with the full mesh, gossip's members with gossip
// membership (whether or not a connection to them is open).
func (m *Membership) Members() []config.NodeConfig {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []config.NodeConfig
	for _, s := range m.slots {
		if s.alive {
			out = append(out, s.cfg)
		}
	}
	return out
}

// OnDemand reports whether control connections are dialed on first use
// (gossip membership) rather than kept to every node: false with the
// full mesh and on a mesh_only node; true on the gossiping nodes of a
// gossip cluster, which still keep one to each mesh_only node
// (Peer.Mesh).
func (m *Membership) OnDemand() bool { return m.onDemand }

// leaveGossip tells the other members this node leaves, so that they see
// it go at once rather than after suspicion.
func (m *Membership) leaveGossip() {
	m.mu.Lock()
	g := m.gossip
	m.mu.Unlock()
	if g != nil {
		if err := g.Leave(m.cfg.DialTimeout); err != nil {
			m.log.Debug("gossip leave", zap.Error(err))
		}
	}
}

// stopGossip stops this node's gossip.
func (m *Membership) stopGossip() {
	m.mu.Lock()
	g := m.gossip
	m.mu.Unlock()
	if g != nil {
		_ = g.Shutdown()
	}
}
