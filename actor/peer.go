package actor

import (
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// peerState is what a node keeps for one peer that is up.
type peerState struct {
	peer *cluster.Peer
	caps rdma.Caps

	mu      sync.Mutex
	pending map[string]*pa.PID // futures waiting on a reply from this peer

	// Messages from the peer waiting for their tensors, in arrival order.
	// The queue never blocks the connection's reader, which must go on
	// reading the control replies the fetches wait for; the messages with
	// tensors in it are bounded by the sender's credits (flow.go).
	inMu     sync.Mutex
	inbox    []*inbound
	inClosed bool          // the peer is down: nothing more is queued
	inWake   chan struct{} // one token: the inbox grew
	queued   atomic.Int64  // messages in inbox or being delivered by the worker
	done     chan struct{}

	credits *credits // for tensor messages sent to the peer

	// targets caches the PIDs of local actors this peer sends to; only the
	// peer's reader goroutine (HandleFrame) uses it.
	targets map[string]*pa.PID
	// held is the reader's reused slice of messages held for an inline
	// mailbox during one batch (procCache.hold).
	held []any
}

// maxCachedTargets bounds peerState.targets; futures, which are answered
// once, are not cached.
const maxCachedTargets = 1024

// target returns the local PID named id.
func (ps *peerState) target(self, id string) *pa.PID {
	if pid, ok := ps.targets[id]; ok {
		return pid
	}
	pid := pa.NewPID(self, id)
	if isFuture(pid) {
		return pid
	}
	if ps.targets == nil || len(ps.targets) >= maxCachedTargets {
		ps.targets = make(map[string]*pa.PID)
	}
	ps.targets[id] = pid
	return pid
}

// push appends in to the inbox; false when the peer is down (nothing
// will deliver it).
func (ps *peerState) push(in *inbound) bool {
	ps.inMu.Lock()
	if ps.inClosed {
		ps.inMu.Unlock()
		return false
	}
	ps.inbox = append(ps.inbox, in)
	ps.inMu.Unlock()
	select {
	case ps.inWake <- struct{}{}:
	default:
	}
	return true
}

// inboxEmpty reports whether nothing waits in the inbox.
func (ps *peerState) inboxEmpty() bool {
	ps.inMu.Lock()
	defer ps.inMu.Unlock()
	return len(ps.inbox) == 0
}

// closeInbox empties the inbox for good and returns what it held.
func (ps *peerState) closeInbox() []*inbound {
	ps.inMu.Lock()
	defer ps.inMu.Unlock()
	ps.inClosed = true
	out := ps.inbox
	ps.inbox = nil
	return out
}

// pop removes the oldest message of the inbox; nil when it is empty.
func (ps *peerState) pop() *inbound {
	ps.inMu.Lock()
	defer ps.inMu.Unlock()
	if len(ps.inbox) == 0 {
		return nil
	}
	in := ps.inbox[0]
	ps.inbox[0] = nil
	ps.inbox = ps.inbox[1:]
	if len(ps.inbox) == 0 {
		ps.inbox = nil // let the array go
	}
	return in
}

func (ps *peerState) addPending(f *pa.PID) {
	ps.mu.Lock()
	ps.pending[f.Id] = f
	ps.mu.Unlock()
}

func (ps *peerState) removePending(f *pa.PID) {
	if f == nil {
		return
	}
	ps.mu.Lock()
	delete(ps.pending, f.Id)
	ps.mu.Unlock()
}

// peer returns the state of the named peer if it is up. It reads the
// snapshot of n.peers that every change publishes, without locking: it runs
// once per message sent and per frame received.
func (n *Node) peer(name string) *peerState {
	if m := n.peerSnap.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// publishPeers copies n.peers into the snapshot peer reads; n.mu is held.
func (n *Node) publishPeers() {
	m := maps.Clone(n.peers)
	n.peerSnap.Store(&m)
}

// handler adapts Node to cluster.Handler.
type handler Node

func (h *handler) PeerUp(p *cluster.Peer) {
	n := (*Node)(h)
	var caps rdma.Caps
	if err := wire.DecodeMsgpack(p.Caps, &caps); err != nil {
		p.Close(fmt.Errorf("actor: bad capabilities from %s: %w", p.Name, err))
		return
	}
	if caps.Node != p.Name || caps.Incarnation != p.Incarnation {
		p.Close(fmt.Errorf("actor: capabilities of %s name %s#%d", p.Name, caps.Node, caps.Incarnation))
		return
	}
	ps := &peerState{peer: p, caps: caps, pending: map[string]*pa.PID{}, inWake: make(chan struct{}, 1), done: make(chan struct{}),
		credits: newCredits(n.opts.maxInFlight, n.opts.maxInFlightBytes)}
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return
	}
	n.peers[p.Name] = ps
	n.publishPeers()
	n.wg.Add(1)
	n.mu.Unlock()
	go n.deliverLoop(ps)
	n.system.EventStream.Publish(&cluster.NodeUp{Node: p.Name, Incarnation: p.Incarnation})
}

func (h *handler) PeerDown(p *cluster.Peer, cause error) {
	n := (*Node)(h)
	n.mu.Lock()
	ps := n.peers[p.Name]
	if ps == nil || ps.peer != p {
		n.mu.Unlock()
		return
	}
	delete(n.peers, p.Name)
	n.publishPeers()
	watches := n.watching[p.Name]
	delete(n.watching, p.Name)
	n.mu.Unlock()
	close(ps.done)

	// Pending requests fail at once.
	ps.mu.Lock()
	pending := ps.pending
	ps.pending = map[string]*pa.PID{}
	ps.mu.Unlock()
	for _, f := range pending {
		n.system.Root.Send(f, &pa.DeadLetterResponse{})
	}
	failedReplies := n.failReplies(p.Name)
	// Watchers of its actors get Terminated.
	for id, ws := range watches {
		who := pa.NewPID(p.Name, id)
		for _, w := range ws {
			n.terminated(w, who, pa.TerminatedReason_AddressTerminated)
		}
	}
	// Transfers from it fail; what it held is released.
	for _, ch := range n.channels {
		ch.PeerDown(p.Name)
	}
	released := n.store.ReleaseHolder(p.Name)
	n.failControls(p.Name)
	n.log.Info("peer down", zap.String("peer", p.Name), zap.Int("pending_failed", len(pending)+failedReplies),
		zap.Int("leases_released", released), zap.Error(cause))
	n.system.EventStream.Publish(&cluster.NodeDown{Node: p.Name, Incarnation: p.Incarnation, Reason: errString(cause)})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (h *handler) HandleFrame(p *cluster.Peer, f wire.Frame) {
	n := (*Node)(h)
	ps := n.peer(p.Name)
	if ps == nil || ps.peer != p {
		return
	}
	switch f := f.(type) {
	case *wire.MessageFrame:
		n.receiveMessage(ps, &f.Message, nil)
	case *wire.MessagesFrame:
		n.stats.MessagesBatched.Add(int64(len(f.Messages)))
		pc := procCache{held: ps.held[:0]}
		for i := range f.Messages {
			n.receiveMessage(ps, &f.Messages[i], &pc)
		}
		pc.flush()
		ps.held = pc.held
	case *wire.SystemFrame:
		n.receiveSystem(ps, &f.System)
	case *wire.ReleaseFrame:
		r := f.Release
		if r.Incarnation != n.incarnation {
			n.log.Warn("release for another incarnation", zap.String("peer", p.Name), zap.Uint64("incarnation", r.Incarnation))
			return
		}
		if err := n.store.Release(r.ExportID, r.Lease); err != nil {
			n.log.Warn("release refused", zap.String("peer", p.Name), zap.Error(err))
		}
	case *wire.ErrorFrame:
		n.controlError(p.Name, &f.Error)
	default:
		n.log.Warn("unexpected frame", zap.String("peer", p.Name), zap.Stringer("type", f.Header().Type))
		p.Close(fmt.Errorf("actor: unexpected %v frame from %s", f.Header().Type, p.Name))
	}
}

func (h *handler) HandleDataConn(peer, channel string, conn net.Conn) {
	n := (*Node)(h)
	ch, ok := n.channels[channel].(rdma.ConnServer)
	if !ok {
		n.log.Warn("data connection for a channel that takes none", zap.String("peer", peer), zap.String("channel", channel))
		conn.Close()
		return
	}
	ch.ServeConn(conn, peer)
}
