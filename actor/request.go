package actor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/internal/deadline"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Errors of Request.
var (
	// ErrDeadLetter: the target of a request does not exist, or the
	// request could not be delivered (the reason is logged). It is
	// protoactor's own future error, so errors.Is works with either.
	ErrDeadLetter = pa.ErrDeadLetter
	// ErrNoReply: the node of a request's target went down (or the
	// connection to it closed) before the reply came. It comes wrapped
	// with ErrNodeDown.
	ErrNoReply = errors.New("actor: no reply: the target's node went down")
	// ErrReplyNotFetched: the reply carried tensors that could not be
	// fetched (the cause is wrapped).
	ErrReplyNotFetched = errors.New("actor: the reply's tensors could not be fetched")
)

// replyPrefix starts the ids of Request's reply addresses ('#' never appears
// in protoactor's own future ids, "future$" and base-64 digits). It starts with
// "future" so that everything that treats futures specially (pending
// requests, dead letters) treats these the same way.
const replyPrefix = "future#"

// Request sends msg to target and waits for the reply the target's handler
// gives with Respond, until ctx ends. It is RequestFuture(...).Result()
// without protoactor's future: the reply address is an entry in the node's
// own table, which saves a process registration, a timer and a lock per
// request, and over TCP or shared memory the caller reads the reply from
// the connection itself while no other goroutine needs to
// (cluster.Peer.Await), which
// saves the hand-off from the connection's reader goroutine; it then runs
// the handling of the other frames it reads too. While it reads, the end of
// ctx is noticed within wire.DefaultCallerReads (200µs). An absent target gives
// ErrDeadLetter at once, a target whose node goes down ErrNoReply; a reply
// that comes after ctx ended is dropped. Targets on this node go through
// protoactor's RequestFuture, with ctx's deadline as the timeout (10 s
// without one). The root context's sender middleware, if any, is not
// applied to remote requests.
func (n *Node) Request(ctx context.Context, target *pa.PID, msg any) (any, error) {
	if target == nil {
		return nil, fmt.Errorf("%w: nil target", ErrDeadLetter)
	}
	if target.Address != n.self.Name {
		if rp := n.remote(target.Address); rp != nil {
			return n.requestRemote(ctx, rp, target, msg)
		}
	}
	timeout := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		if timeout = time.Until(d); timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	return n.system.Root.RequestFuture(target, msg, timeout).Result()
}

// RequestTimeout is Request bounded by timeout instead of a context, as
// protoactor's RequestFuture(target, msg, timeout).Result() is: it gives
// context.DeadlineExceeded once timeout has passed without a reply. It is
// cheaper than Request with a context.WithTimeout of its own per call: no
// runtime timer is armed unless the wait blocks (a reply read by the
// caller itself arms none), and the timeout is noticed as Request notices
// the end of its ctx. A timeout ≤ 0 fails at once.
func (n *Node) RequestTimeout(target *pa.PID, msg any, timeout time.Duration) (any, error) {
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	ctx := deadline.NewTimeout(context.Background(), timeout)
	defer ctx.Release() // the context goes nowhere else
	return n.Request(ctx, target, msg)
}

// replyWait is one request waiting for its reply.
type replyWait struct {
	peer string
	// The result goes to res, published by state (replyDone), unless the
	// caller blocks on ch (replyBlocking, with a context that may end
	// first): then to ch, which has one slot.
	res   replyResult
	state atomic.Uint32
	ch    chan replyResult
	// wt is the wait through the peer's connection, which the caller may
	// read itself (cluster.Peer.Await): whoever sends the result claims
	// it first and notifies it after.
	wt    wire.Waiter
	ready func() bool // whether the result is in res; made once
	// sender is the request's reply address, the sender of its message:
	// kept here, the request's PID costs no allocation of its own. Only
	// the send reads it (a send queued behind tensors copies it).
	sender pa.PID
}

type replyResult struct {
	msg any
	err error
}

// replies is the node's table of requests waiting for a reply.
type replies struct {
	mu sync.Mutex
	m  map[uint64]*replyWait
}

// newReplyKey returns a key for a new request, unused in m (held under
// replies.mu). Keys are random, not counted: a reply is taken from any
// peer (an actor may forward a request to another node, whose reply then
// comes from there), so a key is all that stands between a waiting request
// and a peer that forges its reply; a peer learns only the keys of the
// requests sent to it.
func newReplyKey(m map[uint64]*replyWait) uint64 {
	for {
		if k := rand.Uint64(); k != 0 && m[k] == nil {
			return k
		}
	}
}

// replyWait.state: the result is awaited, in res, or awaited on ch.
const (
	replyPending uint32 = iota
	replyDone
	replyBlocking
)

var replyWaits = sync.Pool{New: func() any {
	w := &replyWait{ch: make(chan replyResult, 1)}
	w.ready = func() bool { return w.state.Load() == replyDone }
	return w
}}

// send hands w its result (only the one who took w from the table does):
// see replyWait.res and replyWait.wt.
func (w *replyWait) send(res replyResult) {
	k := w.wt.Claim()
	w.res = res
	if !w.state.CompareAndSwap(replyPending, replyDone) {
		w.res = replyResult{}
		w.ch <- res // the caller blocks on ch
	}
	k.Notify()
}

// done returns w to the pool once its result was taken, or once it was
// taken from the table by its caller (nothing sends to it again).
func (w *replyWait) done() {
	w.res = replyResult{}
	w.state.Store(replyPending)
	replyWaits.Put(w)
}

func (n *Node) requestRemote(ctx context.Context, rp *remoteProcess, target *pa.PID, msg any) (any, error) {
	w := replyWaits.Get().(*replyWait)
	w.peer = target.Address
	r := &n.replies
	r.mu.Lock()
	if r.m == nil {
		r.m = make(map[uint64]*replyWait)
	}
	key := newReplyKey(r.m)
	r.m[key] = w
	r.mu.Unlock()

	sender := &w.sender
	sender.Address, sender.Id = n.self.Name, replyID(key)
	ps := rp.peer()
	n.sendUserVia(ctx, ps, target, nil, msg, sender)
	if ps == nil {
		ps = n.peer(target.Address) // connected by the send
	}
	// The caller reads the reply from the connection itself when nobody
	// else reads it (no hand-off from the connection's reader).
	if ps != nil && w.state.Load() == replyPending {
		ps.peer.Await(ctx, &w.wt, w.ready)
	}

	// The reply is mostly there already (Await read it): taking it
	// without select spares ctx.Done, which makes the channel of a
	// context that has none yet (one per request, with a per-request
	// timeout).
	var res replyResult
	if w.state.Load() == replyDone || !w.state.CompareAndSwap(replyPending, replyBlocking) {
		res = w.res
	} else {
		select {
		case res = <-w.ch:
		case <-ctx.Done():
			if n.takeReply(key) == nil {
				// The reply (or a failure) is being sent, to ch: take it
				// so that w goes back to the pool empty.
				<-w.ch
			}
			w.wt.Claim().Notify() // no reply will: end the wait
			w.done()
			return nil, ctx.Err()
		}
	}
	w.done() // the entry is gone: nothing sends to w again
	return res.msg, res.err
}

// takeReply removes and returns the request waiting under key.
func (n *Node) takeReply(key uint64) *replyWait {
	r := &n.replies
	r.mu.Lock()
	w := r.m[key]
	delete(r.m, key)
	r.mu.Unlock()
	return w
}

func isReply(id string) bool { return strings.HasPrefix(id, replyPrefix) }

// replyID is the Request reply address of key: replyPrefix and key in
// base 36, lowercase, as strconv.FormatUint(key, 36) writes it (without
// strconv's general path: one is made for every request).
func replyID(key uint64) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var buf [len(replyPrefix) + 13]byte // 13 base-36 digits hold any uint64
	i := len(buf)
	for {
		i--
		buf[i] = digits[key%36]
		if key /= 36; key == 0 {
			break
		}
	}
	i -= len(replyPrefix)
	copy(buf[i:], replyPrefix)
	return string(buf[i:])
}

// replyKey parses the key of a Request reply address; false for any other
// id. It accepts what strconv.ParseUint(s, 36, 64) accepts after the
// prefix (digits of either case, no sign, no underscores, no overflow),
// without strconv's general path.
func replyKey(id string) (uint64, bool) {
	if !strings.HasPrefix(id, replyPrefix) {
		return 0, false
	}
	tail := id[len(replyPrefix):]
	if tail == "" {
		return 0, false
	}
	if len(tail) > 13 { // 13 digits hold any uint64: the rest must be leading zeros
		if tail = strings.TrimLeft(tail, "0"); len(tail) > 13 {
			return 0, false
		}
	}
	var k uint64
	for i := 0; i < len(tail); i++ {
		d := base36[tail[i]]
		if d >= 36 {
			return 0, false
		}
		if i == 12 && k > (1<<64-1-uint64(d))/36 {
			return 0, false // the 13th digit overflows 64 bits
		}
		k = k*36 + uint64(d)
	}
	return k, true
}

// base36 is the value of each byte as a base-36 digit of either case, 36
// or more for bytes that are not one.
var base36 = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i := byte(0); i < 10; i++ {
		t['0'+i] = i
	}
	for i := byte(0); i < 26; i++ {
		t['a'+i], t['A'+i] = 10+i, 10+i
	}
	return t
}()

// completeReply hands a reply (or failure) to the request waiting under
// id; false if id is not a Request address. A reply for a request that no
// longer waits is dropped.
func (n *Node) completeReply(id string, msg any, err error) bool {
	key, ok := replyKey(id)
	if ok {
		n.completeReplyKey(key, id, msg, err)
	}
	return ok
}

// completeReplyKey is completeReply of the Request address id, whose key
// is key.
func (n *Node) completeReplyKey(key uint64, id string, msg any, err error) {
	if w := n.takeReply(key); w != nil {
		w.send(replyResult{msg: msg, err: err})
	} else {
		if id == "" {
			id = replyID(key)
		}
		n.log.Debug("reply after its request ended", zap.String("id", id))
	}
}

// failReplies fails the requests waiting for a reply from peer.
func (n *Node) failReplies(peer string) int {
	r := &n.replies
	var failed []*replyWait
	r.mu.Lock()
	for k, w := range r.m {
		if w.peer == peer {
			failed = append(failed, w)
			delete(r.m, k)
		}
	}
	r.mu.Unlock()
	for _, w := range failed {
		w.send(replyResult{err: fmt.Errorf("%w: %w: %s", ErrNoReply, ErrNodeDown, peer)})
	}
	return len(failed)
}

// replyProcess is the process of every Request reply address: what is
// delivered to one completes the request waiting under it. Replies take
// the same path as messages to actors (tensors fetched first, order kept).
type replyProcess Node

var _ pa.Process = (*replyProcess)(nil)

func (p *replyProcess) SendUserMessage(pid *pa.PID, message any) {
	_, msg, _ := pa.UnwrapEnvelope(message)
	(*Node)(p).completeReply(pid.Id, msg, failedReply(msg))
}

func (p *replyProcess) SendSystemMessage(*pa.PID, any) {}

func (p *replyProcess) Stop(*pa.PID) {}

// failedReply is the error a Request gets for a dead letter or a failure
// report addressed to its reply address.
func failedReply(msg any) error {
	switch m := msg.(type) {
	case nil:
		return fmt.Errorf("%w: empty reply", ErrDeadLetter)
	case *pa.DeadLetterResponse:
		return fmt.Errorf("%w: %v", ErrDeadLetter, m.Target)
	case *DeliveryFailed:
		return fmt.Errorf("%w: %v", ErrDeadLetter, m)
	}
	return nil
}
