package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/tensorferry/tensorferry/internal/mono"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Connections on demand (gossip membership). A Peer is one incarnation of
// another node; its control connection (a link) is dialed by the first
// send after none is open, and closed when no frame went either way for
// transport.idle_timeout. The close is a handshake, so that nothing in
// flight is lost and nothing overtakes:
//
//  1. The end that finds the link idle marks it draining (Peer.gate: only
//     while no send is in flight, so its GoAway(CodeIdle) is its last
//     frame on the link) and sends the GoAway.
//  2. The other end, reading it after every frame sent before it, marks
//     the link draining too, waits for its sends in flight, sends its own
//     GoAway(CodeIdle) (its last frame) and closes once it is written.
//  3. The first end reads that GoAway, after every frame before it, and
//     closes.
//
// A send that finds the link draining waits until it has closed (its
// reader has handled every frame) and dials a new one; an accepted
// connection of that Peer waits likewise. Either end may start a close;
// when both do at once each sees the other's GoAway after its own and
// closes. Any other end of a link (an error, a peer that does not answer
// the GoAway within dial_timeout) takes the Peer down, as with the mesh.

// Peer.gate layout: senders in flight in the low bits, gateDrain, and a
// send count from bit 32 up (it wraps; only its changes matter).
const (
	gateInFlight uint64 = 1<<24 - 1
	gateDrain    uint64 = 1 << 24
	gateSend     uint64 = 1 << 32
)

// errIdle ends a link closed for idleness.
var errIdle = errors.New("cluster: control connection closed after its idle timeout")

// acquire returns the connection of the Peer's current link for one send,
// dialing first when none is open, and counts the send in flight until
// release.
func (p *Peer) acquire(ctx context.Context) (*wire.Conn, error) {
	for {
		v := p.gate.Add(gateSend + 1)
		if v&gateDrain == 0 {
			if l := p.link.Load(); l != nil {
				return l.conn, nil
			}
		}
		p.gate.Add(^uint64(0)) // the send does not go out on this link
		if p.gone.Load() {
			return nil, fmt.Errorf("%w: %s (incarnation %d)", ErrNodeDown, p.Name, p.Incarnation)
		}
		if _, err := p.m.connect(ctx, p.Name, p); err != nil {
			return nil, err
		}
	}
}

// release ends a send that acquire let through.
func (p *Peer) release() { p.gate.Add(^uint64(0)) }

// usable reports whether p has a link open for sends.
func (p *Peer) usable() bool {
	return p.link.Load() != nil && p.gate.Load()&gateDrain == 0
}

// idleDone reports whether both ends said goodbye on l for idleness.
func (l *link) idleDone() bool {
	if !l.said.Load() {
		return false
	}
	select {
	case <-l.heard:
		return true
	default:
		return false
	}
}

// Connect returns the named peer once it is up with a control connection
// open, dialing it if needed (with the full mesh, and for a mesh_only
// peer, it waits for the dial loop). With gossip membership the node must be alive in gossip. ctx
// bounds the wait; without a deadline, dial_timeout does.
func (m *Membership) Connect(ctx context.Context, name string) (*Peer, error) {
	if !m.onDemand || m.meshSlot(name) {
		return m.WaitUp(ctx, name)
	}
	return m.connect(ctx, name, nil)
}

// HeldByMesh reports whether the connection to the named node is kept by
// the mesh's rules (dialed and redialed by this node's dial loop,
// heartbeats): every peer with the full mesh, a mesh_only node (and every
// peer of one) under gossip. A send to such a peer that is not up fails
// at once, as with the full mesh, instead of waiting in Connect.
func (m *Membership) HeldByMesh(name string) bool {
	return !m.onDemand || m.meshSlot(name)
}

// connect waits until the named node's Peer is up with a usable link,
// starting a dial when none is open or in flight. With want set, it fails
// as soon as want is no longer the node's Peer (it went down).
func (m *Membership) connect(ctx context.Context, name string, want *Peer) (*Peer, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.DialTimeout)
		defer cancel()
	}
	for {
		m.mu.Lock()
		s, ok := m.slots[name]
		switch {
		case m.closed:
			m.mu.Unlock()
			return nil, ErrClosed
		case !ok || !s.alive:
			m.mu.Unlock()
			if want != nil {
				return nil, fmt.Errorf("%w: %s (incarnation %d) left", ErrNodeDown, name, want.Incarnation)
			}
			return nil, fmt.Errorf("%w: %q is not a member", ErrUnknownNode, name)
		case want != nil && s.cur != want:
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %s (incarnation %d)", ErrNodeDown, name, want.Incarnation)
		}
		p := s.cur
		if p != nil && isUp(p) && p.usable() {
			m.mu.Unlock()
			return p, nil
		}
		if (p == nil || p.link.Load() == nil) && !s.dialing && !s.accepting {
			s.dialing = true
			m.wg.Add(1)
			go m.dialOnce(s)
		}
		changed, lastErr := s.changed, s.lastErr
		m.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, fmt.Errorf("cluster: connecting to %s: %w (last dial: %w)", name, ctx.Err(), lastErr)
			}
			return nil, fmt.Errorf("cluster: connecting to %s: %w", name, ctx.Err())
		case <-m.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// dialOnce dials the slot's node once for connect; after a failure it
// keeps other dials off for a backoff, so that callers that keep sending
// to a node that does not answer do not dial in a loop.
func (m *Membership) dialOnce(s *slot) {
	defer m.wg.Done()
	m.mu.Lock()
	cfg := s.cfg
	m.mu.Unlock()
	err := m.dial(cfg)
	m.mu.Lock()
	s.lastErr = err
	if err == nil {
		s.failures = 0
		s.dialing = false
		s.signal()
		m.mu.Unlock()
		return
	}
	s.failures++
	backoff := m.cfg.ReconnectMin << min(s.failures-1, 16)
	backoff = min(backoff, m.cfg.ReconnectMax)
	s.signal() // callers see lastErr
	m.mu.Unlock()
	m.log.Debug("dial failed", zap.String("peer", cfg.Name), zap.Error(err))
	t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
	select {
	case <-t.C:
	case <-m.ctx.Done():
		t.Stop()
	}
	m.mu.Lock()
	s.dialing = false
	s.signal()
	m.mu.Unlock()
}

// idleLoop closes links that carried nothing for idle_timeout.
func (m *Membership) idleLoop() {
	defer m.wg.Done()
	idle := m.transport.IdleTimeout
	t := time.NewTicker(max(idle/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			now := mono.Now()
			var drain []*Peer
			m.mu.Lock()
			for _, s := range m.slots {
				p := s.cur
				if p == nil || p.mesh || p.link.Load() == nil || !isUp(p) {
					continue
				}
				v := p.gate.Load()
				if sends := v >> 32; sends != s.sends {
					s.sends, s.sendsMoved = sends, now
					continue
				}
				if frames := p.frames.Load(); frames != s.frames {
					s.frames, s.framesMoved = frames, now
					continue
				}
				last := max(s.sendsMoved, s.framesMoved, p.lastSeen.Load())
				if now-last < int64(idle) {
					continue
				}
				// Only with no send in flight: the GoAway is then the
				// link's last frame from this end.
				if v&(gateInFlight|gateDrain) == 0 && p.gate.CompareAndSwap(v, v|gateDrain) {
					drain = append(drain, p)
				}
			}
			m.mu.Unlock()
			for _, p := range drain {
				if l := p.link.Load(); l != nil {
					m.wg.Add(1)
					go m.sayIdle(p, l)
				}
			}
		}
	}
}

// sayIdle starts closing l, found idle and marked draining: its GoAway,
// then the peer's, then the close.
func (m *Membership) sayIdle(p *Peer, l *link) {
	defer m.wg.Done()
	if !l.said.CompareAndSwap(false, true) {
		return // the peer's GoAway came first: heardIdle answers it
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.DialTimeout)
	defer cancel()
	err := l.conn.Send(ctx, wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeIdle,
		Reason: fmt.Sprintf("no frame for %v", m.transport.IdleTimeout)})
	if err == nil {
		err = l.conn.Flush(ctx)
	}
	if err == nil {
		select {
		case <-l.heard:
		case <-l.conn.Done():
			return // closed meanwhile: connClosed decided
		case <-ctx.Done():
			err = fmt.Errorf("no answer to the idle goodbye: %w", ctx.Err())
		}
	}
	if err != nil {
		l.conn.Fail(fmt.Errorf("cluster: closing the idle connection to %s: %w", p.Name, err))
		return
	}
	l.conn.End(errIdle)
}

// heardIdle handles the peer's GoAway(CodeIdle) on l, on l's reader: every
// frame the peer sent before it has been handled.
func (m *Membership) heardIdle(p *Peer, l *link) {
	l.heardOnce.Do(func() { close(l.heard) })
	if l.said.Load() {
		return // sayIdle waits for this and closes
	}
	p.gate.Or(gateDrain)
	m.wg.Add(1)
	go m.answerIdle(p, l)
}

// answerIdle answers the peer's idle goodbye: once the sends in flight on
// l are queued, this end's GoAway(CodeIdle) goes last, and l closes.
func (m *Membership) answerIdle(p *Peer, l *link) {
	defer m.wg.Done()
	if !l.said.CompareAndSwap(false, true) {
		return // this end said it too, at the same time: sayIdle closes
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.DialTimeout)
	defer cancel()
	for spins := 0; p.gate.Load()&gateInFlight != 0; spins++ {
		if ctx.Err() != nil {
			l.conn.Fail(fmt.Errorf("cluster: closing the idle connection to %s: sends still in flight: %w", p.Name, ctx.Err()))
			return
		}
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
	err := l.conn.Send(ctx, wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeIdle, Reason: "idle goodbye answered"})
	if err == nil {
		err = l.conn.Flush(ctx)
	}
	if err != nil {
		l.conn.Fail(fmt.Errorf("cluster: closing the idle connection to %s: %w", p.Name, err))
		return
	}
	l.conn.End(errIdle)
}

// duplicate reports whether a new connection from the same incarnation
// as cur, dialed by initiator, is refused as a duplicate: with the full
// mesh by the tie-break of keeps, with gossip membership while cur's link
// is open and not closing for idleness. m.mu is held.
func (m *Membership) duplicate(cur *Peer, initiator string) bool {
	if !cur.mesh {
		return cur.usable()
	}
	return m.keeps(cur, initiator)
}

// forgetIfGone drops the slot of a node that left gossip, or (the full
// mesh) a node not in the config that discovery reported gone, once
// nothing refers to it; m.mu is held.
func (m *Membership) forgetIfGone(s *slot) {
	if s.cur != nil || s.dataConns != 0 || s.dialing || s.accepting || m.slots[s.cfg.Name] != s {
		return
	}
	if !s.mesh {
		if s.gossipAlive {
			return
		}
	} else if _, inConfig := m.cfg.Node(s.cfg.Name); !s.evicted || s.dialer || inConfig {
		return
	}
	delete(m.slots, s.cfg.Name)
	s.signal()
}
