package actor

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"net"
	"reflect"
	"sync"
	"sync/atomic"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/transfer"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// peerState is what a node's actor layer keeps for one peer that is up
// (its transfer engine keeps the rest).
type peerState struct {
	peer *cluster.Peer
	ep   *transfer.PeerFlow // the engine's flow state for it

	mu      sync.Mutex
	pending map[string]*pa.PID // futures waiting on a reply from this peer

	// route is what the peer's reader remembers of where messages go.
	route routeCache
	// held is the reader's reused slice of messages held for an inline
	// mailbox during one batch (batch.hold).
	held []any
	// currentIn is the latest snapshot of the peers this state was found
	// current in (Node.current).
	currentIn atomic.Pointer[map[string]*peerState]
}

// current reports whether ps is its peer's state in the current snapshot
// of the peers (Node.peer), remembering the snapshot it was found in: a
// frame finds its peer without a map lookup while the peers do not change.
func (n *Node) current(ps *peerState) bool {
	snap := n.peerSnap.Load()
	if snap == nil {
		return false
	}
	if ps.currentIn.Load() == snap {
		return true
	}
	if (*snap)[ps.peer.Name] != ps {
		return false
	}
	ps.currentIn.Store(snap)
	return true
}

// routeCache is what a peer's reader remembers from one message to the
// next (a peer mostly sends a few types to a few actors): the PIDs of the
// local actors it sends to, the type of its last message and the inline
// mailbox its last message went to. The reader uses it, and so do the
// engine's goroutines that deliver the peer's fetched messages
// (DeliverInline), and a reader whose handler, run there by inline
// delivery, blocks hands reading to a new goroutine
// (wire.ConnOptions.HandlerTakeover) with nothing ordering the two, so its
// slots are atomic: no lock is taken per message.
type routeCache struct {
	// targets is a two-way set-associative table of local PIDs, so that
	// memory stays bounded whatever ids a peer sends (an id that does not
	// repeat only replaces one slot). Futures, which are answered once,
	// are not kept.
	targets  [targetSlots]atomic.Pointer[pa.PID]
	lastType atomic.Pointer[typeRoute]
	// lastOnReader is only ever a mailbox that was registered when stored.
	lastOnReader atomic.Pointer[onReaderMailbox]
}

// targetSlots is the size of a routeCache's targets (a power of two).
const targetSlots = 512

// targetSeed hashes the ids of every routeCache.
var targetSeed = maphash.MakeSeed()

// target returns the PID of this node (self) named id, from the cache or
// new. A miss replaces the empty slot of the id's two, or else the first.
func (rc *routeCache) target(self, id string) *pa.PID {
	i := maphash.String(targetSeed, id) & (targetSlots - 1)
	first, second := &rc.targets[i], &rc.targets[i^1]
	x, y := first.Load(), second.Load()
	if x != nil && x.Id == id {
		return x
	}
	if y != nil && y.Id == id {
		return y
	}
	pid := pa.NewPID(self, id)
	if isFuture(pid) {
		return pid
	}
	if x != nil && y == nil {
		first = second
	}
	first.Store(pid)
	return pid
}

// onReaderMailbox returns the inline mailbox registered under id, if any
// (Node.onReaderRegistered), through the last one.
func (rc *routeCache) onReaderMailbox(n *Node, id string) *onReaderMailbox {
	if mb := rc.lastOnReader.Load(); mb != nil && mb.id == id && mb.registered.Load() {
		return mb
	}
	mb := n.onReaderRegistered(id)
	if mb != nil {
		rc.lastOnReader.Store(mb)
	}
	return mb
}

// typeOf returns the route of the named message type, through the last.
func (rc *routeCache) typeOf(name string) *typeRoute {
	if t := rc.lastType.Load(); t != nil && t.name == name {
		return t
	}
	t := typeRouteOf(name)
	if t.rt != nil {
		rc.lastType.Store(t)
	}
	return t
}

// typeRoute is what a message type's registration decides of its route.
type typeRoute struct {
	name string
	rt   *wire.RegisteredType // nil: not registered
	// plain: carries no tensors; lazy: and may be decoded by its actor's
	// goroutine (lazyMessage): not a lifecycle message (a PoisonPill is
	// checked on the reader).
	plain, lazy bool
}

// typeRoutes holds the typeRoute of every registered type seen (as
// registrations, bounded by the program; a registration never changes).
var typeRoutes sync.Map // string -> *typeRoute

var poisonPillType = reflect.TypeFor[pa.PoisonPill]()

// typeRouteOf returns the route of the named type; an unregistered name
// gets one of its own, not kept.
func typeRouteOf(name string) *typeRoute {
	if t, ok := typeRoutes.Load(name); ok {
		return t.(*typeRoute)
	}
	rt, ok := registry.Type(name)
	if !ok {
		return &typeRoute{name: name}
	}
	plain := !transfer.HoldsTensors(rt.Type())
	t, _ := typeRoutes.LoadOrStore(name, &typeRoute{name: name, rt: rt, plain: plain, lazy: plain && rt.Type() != poisonPillType})
	return t.(*typeRoute)
}

// decode decodes m, a message of the type, through its registration.
func (t *typeRoute) decode(m *wire.Message) (any, error) {
	if t.rt == nil {
		return registry.Decode(m.Type, m.Ser, m.Body) // its error names the type
	}
	return t.rt.Decode(m.Ser, m.Body)
}

func (ps *peerState) addPending(f *pa.PID) {
	ps.mu.Lock()
	ps.pending[f.Id] = f
	ps.mu.Unlock()
}

// takePending removes and returns every request waiting on the peer, and
// notes their futures in failed (PeerDown fails them) before another
// goroutine can find them gone (claimFuture).
func (ps *peerState) takePending(failed *failedFutures) map[string]*pa.PID {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	pending := ps.pending
	ps.pending = map[string]*pa.PID{}
	failed.add(pending)
	return pending
}

// failedFutures are the last futures PeerDown failed (at most
// failedFutureMemory): a reply to one of them, from another node or from
// the dying connection's reader, must not give it a second result.
type failedFutures struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	ring []string // the ids in the order added, the oldest replaced first; made by the first add
	next int
}

// failedFutureMemory bounds failedFutures. A future that PeerDown failed
// leaves protoactor's registry as it takes that result; a reply that comes
// later finds no process and becomes a dead letter. Only a reply racing the
// failure needs the entry.
const failedFutureMemory = 4096

func (f *failedFutures) add(pending map[string]*pa.PID) {
	if f == nil || len(pending) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ids == nil {
		f.ids = make(map[string]struct{})
		f.ring = make([]string, failedFutureMemory)
	}
	for id := range pending {
		delete(f.ids, f.ring[f.next]) // "" or an id added failedFutureMemory ago
		f.ring[f.next] = id
		f.next = (f.next + 1) % failedFutureMemory
		f.ids[id] = struct{}{}
	}
}

// has reports whether PeerDown failed the future id (lately: the last
// failedFutureMemory).
func (f *failedFutures) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.ids[id]
	return ok
}

// claimFuture decides whether a reply from ps may go to the protoactor
// future f: it takes f from the requests waiting on ps, or on another peer
// (a request forwarded to a third node is answered by that node), so that
// PeerDown no longer fails it. It reports false when PeerDown already took
// f to fail it: a second result would race the first (protoactor's future
// takes its result unguarded). A future that waits on no peer (its PID
// travelled in a message body) takes the reply.
func (n *Node) claimFuture(ps *peerState, f *pa.PID) bool {
	if ps.removePending(f) {
		return true
	}
	if m := n.peerSnap.Load(); m != nil {
		for _, q := range *m {
			if q != ps && q.removePending(f) {
				return true
			}
		}
	}
	return !n.failedFutures.has(f.Id)
}

// removePending removes f from the requests waiting on the peer and
// reports whether it was there: false once PeerDown has taken it to fail
// it, when f must not get a second result (a protoactor future takes its
// result unguarded: two racing results are a data race).
func (ps *peerState) removePending(f *pa.PID) bool {
	if f == nil {
		return false
	}
	ps.mu.Lock()
	_, ok := ps.pending[f.Id]
	delete(ps.pending, f.Id)
	ps.mu.Unlock()
	return ok
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

// connectedPeer returns the state of the named peer, connecting to it
// first with gossip membership, where control connections are dialed on
// first use (bounded by the cluster's dial_timeout); otherwise the error
// says why there is none. A peer whose connection the mesh keeps (a
// mesh_only node under gossip) that is not up fails at once, as with the
// full mesh: its dial loop is already at work.
func (n *Node) connectedPeer(name string) (*peerState, error) {
	if ps := n.peer(name); ps != nil {
		return ps, nil
	}
	if n.members == nil || n.members.HeldByMesh(name) || name == n.self.Name {
		return nil, fmt.Errorf("%w: %s", ErrNodeDown, name)
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.DialTimeout)
	defer cancel()
	if _, err := n.members.Connect(ctx, name); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNodeDown, name, err)
	}
	if ps := n.peer(name); ps != nil {
		return ps, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNodeDown, name)
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
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return
	}
	n.mu.Unlock()
	ep, err := n.eng.PeerUp(p.Name, p.Incarnation, p.Caps, p)
	if err != nil {
		p.Close(err)
		return
	}
	ps := &peerState{peer: p, ep: ep, pending: map[string]*pa.PID{}}
	p.SetLocal(ps)
	n.mu.Lock()
	n.peers[p.Name] = ps
	n.publishPeers()
	n.mu.Unlock()
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
	// Pending requests fail at once. They are taken while ps is still
	// in the snapshot that claimFuture searches: a reply racing the
	// failure finds either its future still waiting or it noted failed.
	pending := ps.takePending(&n.failedFutures)
	delete(n.peers, p.Name)
	n.publishPeers()
	watches := n.watching[p.Name]
	delete(n.watching, p.Name)
	n.mu.Unlock()

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
	// Its actors' watches on ours end.
	n.dropWatchers(p.Name)
	// Transfers from it fail; what it held is released.
	released := n.eng.PeerDown(p.Name)
	n.log.Info("peer down", zap.String("peer", p.Name), zap.Int("pending_failed", len(pending)+failedReplies),
		zap.Int("leases_released", released), zap.Error(cause))
	n.stats.NodeDowns.Add(1)
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
	ps, _ := p.Local().(*peerState)
	if ps == nil || !n.current(ps) {
		return
	}
	switch f := f.(type) {
	case *wire.MessageFrame:
		n.receiveMessage(ps, &f.Message, nil)
	case *wire.MessagesFrame:
		n.stats.MessagesBatched.Add(int64(len(f.Messages)))
		n.stats.BatchFrames.Add(1)
		b := batch{held: ps.held[:0]}
		for i := range f.Messages {
			n.receiveMessage(ps, &f.Messages[i], &b)
		}
		b.flush()
		ps.held = b.held
	case *wire.SystemFrame:
		n.receiveSystem(ps, &f.System)
	case *wire.ReleaseFrame:
		n.eng.HandleRelease(p.Name, &f.Release)
	case *wire.ErrorFrame:
		n.eng.HandleError(p.Name, &f.Error)
	default:
		n.log.Warn("unexpected frame", zap.String("peer", p.Name), zap.Stringer("type", f.Header().Type))
		p.Close(fmt.Errorf("actor: unexpected %v frame from %s", f.Header().Type, p.Name))
	}
}

func (h *handler) HandleDataConn(peer, channel string, conn net.Conn) {
	(*Node)(h).eng.HandleDataConn(peer, channel, conn)
}
