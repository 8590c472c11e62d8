package gossip

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// change is what memberlist last said about one node, and whether it said
// the node was gone since the last delivery.
type change struct {
	name       string
	alive      bool   // alive (or suspected) with meta; false: dead or left
	gossipAddr string // memberlist's address of the node
	meta       []byte // a copy, at most memberlist.MetaMaxSize+1 bytes
	left       bool   // a leave was seen since the last delivery
	reason     string // the reason of that leave
}

// eventQueue holds memberlist's notifications until the delivery goroutine
// takes them: one change per node, coalesced, in the order the nodes first
// changed. memberlist calls put with its locks held; put only takes the
// queue's own lock and never blocks on the consumer.
type eventQueue struct {
	self string
	wake chan struct{}

	mu      sync.Mutex
	pending map[string]*change
	order   []string
}

func (q *eventQueue) init(self string) {
	q.self = self
	q.wake = make(chan struct{}, 1)
	q.pending = make(map[string]*change)
}

func (q *eventQueue) put(n *memberlist.Node, alive bool, reason string) {
	if n.Name == q.self {
		return
	}
	q.mu.Lock()
	c, ok := q.pending[n.Name]
	if !ok {
		c = &change{name: n.Name}
		q.pending[n.Name] = c
		q.order = append(q.order, n.Name)
	}
	c.alive = alive
	c.gossipAddr = n.Address()
	if alive {
		c.meta = bytes.Clone(n.Meta[:min(len(n.Meta), memberlist.MetaMaxSize+1)])
	} else {
		c.left, c.reason = true, reason
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take removes and returns the pending changes, in order.
func (q *eventQueue) take() []*change {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]*change, 0, len(q.order))
	for _, name := range q.order {
		out = append(out, q.pending[name])
	}
	clear(q.pending)
	q.order = q.order[:0]
	return out
}

// eventDelegate is the Gossip as memberlist's EventDelegate.
type eventDelegate Gossip

func (e *eventDelegate) NotifyJoin(n *memberlist.Node)   { e.events.put(n, true, "") }
func (e *eventDelegate) NotifyUpdate(n *memberlist.Node) { e.events.put(n, true, "") }
func (e *eventDelegate) NotifyLeave(n *memberlist.Node) {
	// memberlist does not say whether the node left (n.State is not
	// set): a node that leaves says so first, in its meta (see apply).
	e.events.put(n, false, reasonDead)
}

// Reasons of Leave.
const (
	reasonDead = "dead: failed probes, suspicion not refuted"
	reasonLeft = "left"
)

// deliver is the one goroutine that calls Events.
func (g *Gossip) deliver() {
	defer close(g.done)
	for {
		select {
		case <-g.stop:
			return
		case <-g.events.wake:
		}
		for _, c := range g.events.take() {
			select {
			case <-g.stop:
				return
			default:
			}
			g.apply(c)
		}
	}
}

// apply turns one node's change into Leave and Join calls, against what
// Events saw of the node before.
func (g *Gossip) apply(c *change) {
	g.mu.Lock()
	cur, had := g.members[c.name]
	leaving := g.leaving[c.name]
	g.mu.Unlock()
	if c.left && c.reason == reasonDead && (leaving || saysLeaving(c.meta)) {
		c.reason = reasonLeft
	}

	var next Member
	if c.alive {
		m, err := decodeMeta(c.meta)
		if err != nil {
			g.badMetaOnce(c, err)
			if had {
				g.leave(cur, "unreadable node meta")
			}
			return
		}
		g.mu.Lock()
		delete(g.badMeta, c.name)
		if m.Leaving {
			g.leaving[c.name] = true
		}
		g.mu.Unlock()
		next = Member{Name: c.name, Incarnation: m.Incarnation, Address: m.Address, DataAddress: m.DataAddress, GossipAddress: c.gossipAddr}
	}
	if had {
		switch {
		case !c.alive || c.left && next.Incarnation <= cur.Incarnation:
			g.leave(cur, c.reason)
		case next.Incarnation > cur.Incarnation:
			g.leave(cur, fmt.Sprintf("restarted as incarnation %d", next.Incarnation))
		case next.Incarnation < cur.Incarnation:
			g.log.Warn("a lower incarnation claims a member's name: ignored",
				zap.String("member", c.name), zap.Uint64("incarnation", cur.Incarnation), zap.Uint64("claimed", next.Incarnation),
				zap.String("gossip_address", c.gossipAddr))
			return
		case next == cur:
			return
		default:
			g.leave(cur, "announced other addresses")
		}
	}
	if !c.alive {
		g.mu.Lock()
		delete(g.badMeta, c.name)
		g.mu.Unlock()
		return
	}
	g.mu.Lock()
	high, seen := g.highest[c.name]
	stale := seen && next.Incarnation < high
	if !stale {
		g.members[c.name] = next
		g.highest[c.name] = next.Incarnation
	}
	g.mu.Unlock()
	if stale {
		g.log.Warn("a lower incarnation claims a member's name: ignored",
			zap.String("member", c.name), zap.Uint64("incarnation", high), zap.Uint64("claimed", next.Incarnation),
			zap.String("gossip_address", c.gossipAddr))
		return
	}
	g.log.Debug("member joined", zap.String("member", c.name), zap.Uint64("incarnation", next.Incarnation),
		zap.String("gossip_address", next.GossipAddress))
	g.ev.Join(next)
}

func (g *Gossip) leave(m Member, reason string) {
	g.mu.Lock()
	delete(g.members, m.Name)
	delete(g.leaving, m.Name)
	g.mu.Unlock()
	g.log.Debug("member left", zap.String("member", m.Name), zap.Uint64("incarnation", m.Incarnation), zap.String("reason", reason))
	g.ev.Leave(m, reason)
}

// badMetaOnce logs a member's undecodable meta, once for each distinct meta.
func (g *Gossip) badMetaOnce(c *change, err error) {
	g.mu.Lock()
	logged := g.badMeta[c.name] == string(c.meta)
	g.badMeta[c.name] = string(c.meta)
	g.mu.Unlock()
	if !logged {
		g.log.Warn("member with unreadable node meta: not reported as joined",
			zap.String("member", c.name), zap.String("gossip_address", c.gossipAddr), zap.Error(err))
	}
}

// saysLeaving reports whether meta decodes and says its node is leaving.
func saysLeaving(meta []byte) bool {
	m, err := decodeMeta(meta)
	return err == nil && m.Leaving
}
