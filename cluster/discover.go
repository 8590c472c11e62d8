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

// Discovery (config section discovery, package discovery) with gossip
// membership: the nodes a discovery source announces are gossip seeds,
// and one it reports gone (its lease expired in etcd, say) is down at once
// and stays down until the source announces it again, whatever gossip
// says meanwhile.

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
	m.wg.Add(1)
	go m.seedLoop()
	return nil
}

// discovered handles one event of the discovery source (from its one
// goroutine, in order).
func (m *Membership) discovered(ev discovery.Event) {
	name := ev.Node.Name
	switch ev.Kind {
	case discovery.Joined:
		m.mu.Lock()
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
