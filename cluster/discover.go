package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/cluster/gossip"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/discovery"
	"go.uber.org/zap"
)

// Discovery (config section discovery, package discovery). With gossip
// membership the nodes a discovery source announces are gossip seeds,
// but for those it announces mesh_only (PyTorch nodes), which are kept by
// the mesh's rules as the config's mesh_only nodes are; with the full
// mesh they are peers like the config's nodes, each dialed with backoff
// and watched with heartbeats. With either, a node the
// source reports gone (it left, or its lease expired in etcd) is down at
// once and stays down until the source announces it again, whatever
// gossip or a connection from it says meanwhile.

// startDiscovery starts the discovery source of the config, when it has
// one besides the node list.
func (m *Membership) startDiscovery() error {
	if m.cfg.Discovery == nil || m.cfg.Discovery.Etcd == nil {
		return nil
	}
	d, err := discovery.NewEtcd(m.cfg, m.log)
	if err != nil {
		return fmt.Errorf("cluster: discovery: %w", err)
	}
	m.seedWake = make(chan struct{}, 1)
	m.mu.Lock()
	m.disc = d
	m.mu.Unlock()
	// A node restarted within a lease of its crash waits for its old
	// registration to expire.
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.Discovery.Etcd.LeaseTTL+2*m.cfg.Discovery.Etcd.DialTimeout)
	defer cancel()
	if err := d.Start(ctx, m.self, m.discovered); err != nil {
		return fmt.Errorf("cluster: discovery %v: %w", d, err)
	}
	m.log.Info("discovery started", zap.Stringer("source", d))
	if m.onDemand {
		m.wg.Add(1)
		go m.seedLoop()
	}
	return nil
}

// discovered handles one event of the discovery source (from its one
// goroutine, in order).
func (m *Membership) discovered(ev discovery.Event) {
	name := ev.Node.Name
	switch ev.Kind {
	case discovery.Joined:
		m.mu.Lock()
		if !m.onDemand || ev.Node.MeshOnly {
			// The full mesh takes every announced node; gossip, those
			// that do not gossip.
			back, refused := m.announced(ev.Node)
			m.mu.Unlock()
			switch {
			case refused != "":
				if m.announceWarn.Allow() {
					m.log.Warn("discovery announces a node the mesh does not take: ignored",
						zap.String("peer", name), zap.String("why", refused))
				}
			case back:
				m.log.Info("member announced again", zap.String("peer", name))
			}
			return
		}
		if s := m.slots[name]; s != nil && s.mesh {
			// Announced mesh_only before, or one of the config's
			// mesh_only nodes: a name's mark holds while this node
			// knows it.
			m.mu.Unlock()
			if m.announceWarn.Allow() {
				m.log.Warn("discovery announces a mesh_only node as gossiping: ignored while it is known",
					zap.String("peer", name))
			}
			return
		}
		if m.seeds == nil {
			m.seeds = map[string]config.NodeConfig{}
		}
		m.seeds[name] = ev.Node
		var back bool
		if s := m.slots[name]; s != nil && s.evicted {
			s.evicted = false
			if s.gossipAlive {
				s.alive, back = true, true
				s.signal()
				close(m.joined)
				m.joined = make(chan struct{})
			}
		}
		m.mu.Unlock()
		if back {
			m.log.Info("member announced again", zap.String("peer", name))
		}
		select {
		case m.seedWake <- struct{}{}:
		default:
		}
	case discovery.Left:
		m.mu.Lock()
		delete(m.seeds, name)
		m.mu.Unlock()
		if ev.Reason == discovery.ReasonChanged {
			return // a Joined with the new addresses follows
		}
		m.evict(name, ev.Reason)
	}
}

// MaxMeshAnnounced bounds the nodes the mesh's rules take from a discovery
// source besides the config's (every announced node with the full mesh,
// the mesh_only ones with gossip): each is dialed and kept connected, so
// whoever may write under the source's prefix could otherwise make a node
// hold a goroutine and a connection per name written. The mesh suits a
// few nodes; gossip membership has no such bound.
const MaxMeshAnnounced = 1024

// announced makes n, which the discovery source announces, a node kept by
// the mesh's rules (every node with the full mesh, a mesh_only one with
// gossip): known, with its latest addresses, and dialed (a node that
// restarted comes back with a new incarnation: placeLink). It reports
// whether the node had been reported gone, and why it is not taken:
// MaxMeshAnnounced other announced nodes are kept so, or (gossip) a
// gossiping node has the name. m.mu is held.
func (m *Membership) announced(n config.NodeConfig) (back bool, refused string) {
	s := m.slots[n.Name]
	switch {
	case s != nil && !s.mesh:
		return false, "a gossiping node has the name"
	case s == nil:
		kept := 0
		for name, o := range m.slots {
			if _, inConfig := m.cfg.Node(name); o.mesh && !inConfig {
				kept++
			}
		}
		if kept >= MaxMeshAnnounced {
			return false, fmt.Sprintf("%d announced nodes are dialed already, at most", kept)
		}
		s = &slot{changed: make(chan struct{}), mesh: true}
		m.slots[n.Name] = s
	}
	back = s.evicted
	s.cfg, s.evicted, s.alive = n, false, true
	s.signal()
	close(m.joined)
	m.joined = make(chan struct{})
	m.startDialer(s)
	return back, ""
}

// evict takes a node the discovery source reports gone down, and keeps it
// so until the source announces it again.
func (m *Membership) evict(name, why string) {
	m.mu.Lock()
	s := m.slots[name]
	if s == nil {
		m.mu.Unlock()
		return
	}
	s.evicted = true
	wasAlive := s.alive
	s.alive = false
	p := s.cur
	s.signal()
	m.mu.Unlock()
	if wasAlive {
		m.log.Info("member gone from discovery", zap.String("peer", name), zap.String("reason", why))
	}
	if p != nil {
		m.dropPeer(p, fmt.Errorf("%w: discovery: %s", ErrNodeDown, why))
	}
	m.mu.Lock()
	if s := m.slots[name]; s != nil {
		m.forgetIfGone(s)
	}
	m.mu.Unlock()
}

// seedLoop joins the gossip through the announced nodes it does not know
// yet, a few at a time: once this node is in, gossip tells it the rest.
func (m *Membership) seedLoop() {
	defer m.wg.Done()
	t := time.NewTicker(max(m.cfg.Gossip.GossipInterval, 10*time.Millisecond) * 10)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.seedWake:
		case <-t.C:
		}
		var addrs []string
		m.mu.Lock()
		for name, n := range m.seeds {
			if s := m.slots[name]; s != nil && s.gossipAlive {
				continue
			}
			addrs = append(addrs, n.GossipAddress)
			if len(addrs) == gossip.JoinFanout { // Join stops after as many answers
				break
			}
		}
		m.mu.Unlock()
		if len(addrs) == 0 {
			continue
		}
		if n, err := m.gossip.Join(addrs); n == 0 {
			m.log.Debug("announced nodes did not answer the gossip join", zap.Strings("seeds", addrs), zap.Error(err))
		}
	}
}

// stopDiscovery deregisters this node from the discovery source.
func (m *Membership) stopDiscovery() {
	m.mu.Lock()
	d := m.disc
	m.mu.Unlock()
	if d != nil {
		if err := d.Close(); err != nil {
			m.log.Debug("discovery close", zap.Error(err))
		}
	}
}
