package transfer

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorferry/tensorferry/internal/deadline"
	"go.uber.org/zap"
)

// fetchWindow bounds how many queued messages of one peer have their
// tensors fetched at once: fetching several overlaps the CPU work of one
// message with the copies of the others; delivery stays in arrival order.
const fetchWindow = 4

// queued is one message in a peer's inbox: its tensors to fetch (nil for a
// message without any that waits behind others) and how to deliver it.
type queued struct {
	in      *Incoming
	size    int64
	deliver Delivery
	fetched chan error
	held    int64 // budget taken for it
}

// inbox is a peer's queue of received messages waiting for their tensors,
// or behind messages that do. The connection's reader only appends to it
// (it must go on reading the control replies the fetches wait for); what
// it holds is bounded: messages with tensors by the window advertised to
// the peer, all messages by count and encoded bytes.
type inbox struct {
	mu        sync.Mutex
	q         []*queued
	closed    bool
	wake      chan struct{} // one token: the inbox grew
	maxMsgs   int
	maxBytes  int64
	bytes     int64
	windowMax int          // messages with tensors not yet fetched, at most
	inWindow  int          // such messages now
	pending   atomic.Int64 // messages in q or being delivered
}

func (b *inbox) init(maxMsgs int, maxBytes int64, window int) {
	b.maxMsgs, b.maxBytes, b.windowMax = maxMsgs, maxBytes, window
	b.wake = make(chan struct{}, 1)
}

// Backlog reports whether messages of the peer wait in its inbox (or are
// being delivered), so that a message that needs no fetch must be enqueued
// behind them to keep the order.
func (p *PeerFlow) Backlog() bool { return p.inbox.pending.Load() > 0 }

// Queues reports whether a received message with in to fetch (nil: none)
// goes through the engine (Accept) rather than at once to its actor (the
// routes: package doc): when it has tensors to fetch or messages of the
// peer wait ahead of it (order holds).
func (p *PeerFlow) Queues(in *Incoming) bool { return in != nil || p.Backlog() }

// Accept hands the engine a received message of peer that Queues: alone
// (in its frame, from the connection's reader) as Receive does, which
// may fetch and deliver it on the calling goroutine (mayBlock: its
// take-over), else as Enqueue does; the package doc lists the routes.
// Its errors are theirs.
func (e *Engine) Accept(peer string, in *Incoming, size int64, d Delivery, alone bool, mayBlock func()) error {
	if alone {
		return e.Receive(peer, in, size, d, mayBlock)
	}
	return e.Enqueue(peer, in, size, d)
}

// Delivery is a received message's node side: Deliver is called once its
// tensors are fetched (err nil) or with the reason they are not (the
// message is then dropped: Deliver reports it to its sender).
type Delivery interface {
	Deliver(err error)
}

// InlineDelivery is a Delivery that may run the message's handling on the
// goroutine that delivers it (an actor's inline mailbox) instead of handing
// it to another goroutine: inline delivery, unrelated to inline tensors. DeliverInline delivers as Deliver does and, once
// the message has its place downstream and before anything that may block
// runs, calls handoff (at most once); the calling goroutine is then the
// handler's until DeliverInline returns. A DeliverInline that does not call
// handoff ran no handler on the calling goroutine. The engine uses it for a message that
// arrives alone (nothing else of its peer queued or being fetched):
//   - delivered by the peer's delivery loop, handoff moves the loop to
//     another goroutine, which gives the message's leases back while the
//     handler runs;
//   - fetched and delivered by the connection's reader (Receive), handoff
//     gives the message's leases back, then calls the one Receive was
//     given (the connection's take-over).
type InlineDelivery interface {
	Delivery
	DeliverInline(err error, handoff func())
}

// Enqueue queues a message of peer (in: its fetches, nil for none; size:
// its encoded bytes) for delivery in arrival order (d.Deliver). A message beyond the
// inbox's bounds is refused with ErrInboxFull, and a peer that keeps
// sending messages with tensors beyond the window it was given has its
// connection closed. ErrPeerDown when the peer is not up.
func (e *Engine) Enqueue(peer string, in *Incoming, size int64, d Delivery) error {
	p := e.peer(peer)
	if p == nil {
		return fmt.Errorf("%w: %s", ErrPeerDown, peer)
	}
	b := &p.inbox
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrPeerDown, peer)
	case in != nil && b.inWindow >= b.windowMax:
		waiting := b.inWindow
		b.mu.Unlock()
		e.stats.InboxRefused.Add(1)
		if n := p.strikes.Add(1); n == maxStrikes {
			err := fmt.Errorf("transfer: %s sent %d messages with tensors beyond the window of %d it was given", peer, n, b.windowMax)
			e.log.Warn("closing the connection of a peer that ignores its window", zap.String("peer", peer), zap.Error(err))
			p.link.Close(err)
		}
		return fmt.Errorf("%w: %d messages with tensors wait already (window %d)", ErrInboxFull, waiting, b.windowMax)
	case len(b.q) >= b.maxMsgs || b.bytes+size > b.maxBytes:
		msgs, bytes := len(b.q), b.bytes
		b.mu.Unlock()
		e.stats.InboxRefused.Add(1)
		return fmt.Errorf("%w: %d messages of %d bytes wait already", ErrInboxFull, msgs, bytes)
	}
	b.q = append(b.q, &queued{in: in, size: size, deliver: d})
	b.bytes += size
	if in != nil {
		b.inWindow++
	}
	b.pending.Add(1)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return nil
}

// ReaderFetchMax is the largest tensor Receive fetches on the connection's
// reader: the frames behind it wait for the copy (16 MiB: about 40 µs over
// NVLink, under a millisecond over PCIe). Larger ones go through the
// delivery loop, whose hand-off costs little beside their copy.
const ReaderFetchMax = 16 << 20

// Receive is Enqueue for the goroutine that reads peer's connection, which
// may fetch and deliver the message itself. When nothing of peer is queued
// or being delivered, the message has one tensor of at most ReaderFetchMax
// bytes to fetch, the budgets have room for it at once and its channel can
// fetch it without waiting for another node (rdma.DirectFetcher: ipc from
// an allocation already mapped), the fetch and the delivery run on the
// calling goroutine, without the hand-off to the peer's delivery loop; an
// InlineDelivery then runs its handler here too, its handoff giving the
// message's leases back and then calling mayBlock (nil: none). Anything
// else is enqueued as Enqueue does, with its errors.
func (e *Engine) Receive(peer string, in *Incoming, size int64, d Delivery, mayBlock func()) error {
	if in != nil && len(in.jobs) == 1 && in.bytes <= ReaderFetchMax {
		if p := e.peer(peer); p != nil && p.inbox.claimIdle() {
			if e.receiveNow(p, in, d, mayBlock) {
				return nil
			}
			p.inbox.unclaim()
		}
	}
	return e.Enqueue(peer, in, size, d)
}

// receiveNow fetches and delivers in, which has a place claimed in p's
// idle inbox (claimIdle), on the calling goroutine when the budgets have
// room at once and the fetch needs nothing from another node; false,
// nothing done (the claim still held), otherwise.
func (e *Engine) receiveNow(p *PeerFlow, in *Incoming, d Delivery, mayBlock func()) bool {
	q := &queued{in: in, deliver: d}
	if n := in.Bytes(); n > 0 {
		if !p.budget.tryAcquire(n) {
			return false
		}
		if !e.budget.tryAcquire(n) {
			p.budget.release(n)
			return false
		}
		q.held = n
	}
	ctx, cancel := deadline.WithTimeout(e.ctx, e.cfg.Flow.TransferTimeout)
	done, err := in.fetchDirect(ctx)
	cancel()
	if !done {
		e.releaseBudget(p, q)
		return false
	}
	p.inbox.fetchedOne()
	e.stats.ReaderDeliveries.Add(1)
	id, ok := d.(InlineDelivery)
	if !ok || err != nil {
		e.deliverFetched(p, q, err)
		return true
	}
	e.releaseBudget(p, q)
	handed := false
	id.DeliverInline(nil, func() {
		if handed {
			return
		}
		handed = true
		// The leases go back before the handler runs: a handler that
		// waits for the peer must not hold the credits the peer needs
		// to answer.
		e.afterDelivery(p, q, nil)
		if mayBlock != nil {
			mayBlock()
		}
	})
	if !handed {
		e.afterDelivery(p, q, nil)
	}
	return true
}

// claimIdle takes a place for a message delivered outside the queue when
// nothing is queued or being delivered and the window has room: it counts
// in the window and in pending as a queued message does, so that later
// messages queue behind it. unclaim gives the place back.
func (b *inbox) claimIdle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.q) > 0 || b.pending.Load() > 0 || b.inWindow >= b.windowMax {
		return false
	}
	b.inWindow++
	b.pending.Add(1)
	return true
}

func (b *inbox) unclaim() {
	b.mu.Lock()
	b.inWindow--
	b.pending.Add(-1)
	b.mu.Unlock()
}

// pop removes the oldest message; nil when the inbox is empty.
func (b *inbox) pop() *queued {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.q) == 0 {
		return nil
	}
	q := b.q[0]
	b.q[0] = nil
	b.q = b.q[1:]
	if len(b.q) == 0 {
		b.q = nil // let the array go
	}
	b.bytes -= q.size
	return q
}

func (b *inbox) empty() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.q) == 0
}

// fetchedOne frees a window place: called once a message's tensors are
// fetched, before their leases are released (the sender's credit comes
// back with the release, and may send the next message at once).
func (b *inbox) fetchedOne() {
	b.mu.Lock()
	b.inWindow--
	b.mu.Unlock()
}

// close empties the inbox for good and returns what it held.
func (b *inbox) close() []*queued {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	out := b.q
	b.q, b.bytes = nil, 0
	return out
}

// deliverLoop fetches the tensors of p's queued messages, up to fetchWindow
// at once, each once the budgets allow, and delivers them in arrival order.
// When the peer goes down, messages not started are aborted; those started
// are delivered once fetched, or reported failed.
func (e *Engine) deliverLoop(p *PeerFlow) {
	st := &loopState{order: make(chan *queued, fetchWindow-1)}
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		for q := range st.order {
			e.deliverFetched(p, q, <-q.fetched)
			st.handed.Add(-1)
		}
	}()
	e.runLoop(p, st)
}

// loopState is a peer's delivery loop, which moves to another goroutine
// when a handler runs on the one running it (InlineDelivery).
type loopState struct {
	// order carries the messages whose fetches run concurrently to the
	// goroutine that delivers them in order.
	order  chan *queued
	handed atomic.Int64 // messages in order or being delivered
	wg     sync.WaitGroup
}

// runLoop is the delivery loop of p on this goroutine until p goes down,
// or until a handler run there (InlineDelivery) takes the goroutine: the
// loop then goes on in another one, which inherits the loop's place in
// e.wg (Close does not wait for a handler, as it does not wait for an
// actor's goroutine).
func (e *Engine) runLoop(p *PeerFlow, st *loopState) {
	movedOn := false
	defer func() {
		if !movedOn {
			e.wg.Done()
		}
	}()
	end := func() {
		close(st.order)
		st.wg.Wait()
	}
	for {
		if q := p.inbox.pop(); q != nil {
			if err := e.take(p, q); err != nil {
				// The peer went down (or the engine closed) while it
				// waited for the budget: aborted with the rest.
				e.abortQueued(p, q, err)
				e.abortInbox(p)
				end()
				return
			}
			if st.handed.Load() == 0 && p.inbox.empty() && !q.in.mayRelay() {
				// A lone message: fetched and delivered on this goroutine.
				if movedOn = e.deliverLone(p, q, e.fetchNow(p, q), st); movedOn {
					return // its handler ran here: the loop went on elsewhere
				}
				continue
			}
			q.fetched = make(chan error, 1)
			if q.in == nil {
				q.fetched <- nil
			} else {
				go func() { q.fetched <- e.fetchNow(p, q) }()
			}
			st.handed.Add(1)
			st.order <- q
			continue
		}
		select {
		case <-p.inbox.wake:
		case <-p.done:
			e.abortInbox(p)
			end()
			return
		}
	}
}

// deliverLone delivers a message that arrived alone, whose fetch ended with
// err. When its Delivery runs the handler on this goroutine
// (InlineDelivery), the loop moves to a new goroutine first (deliverLone
// then reports true, once the handler has returned): a handler that
// blocks, waiting for a reply of the same peer that carries tensors for
// one, must not block that peer's deliveries.
func (e *Engine) deliverLone(p *PeerFlow, q *queued, err error, st *loopState) (movedOn bool) {
	d, ok := q.deliver.(InlineDelivery)
	if !ok || err != nil {
		e.deliverFetched(p, q, err)
		return false
	}
	e.releaseBudget(p, q)
	d.DeliverInline(nil, func() {
		if movedOn {
			return
		}
		movedOn = true
		// The new goroutine gives q's leases back (a frame to the owner)
		// while the handler already runs here, then goes on with the loop,
		// in this goroutine's place in e.wg.
		go func() {
			e.afterDelivery(p, q, nil)
			e.runLoop(p, st)
		}()
	})
	if !movedOn {
		e.afterDelivery(p, q, nil)
	}
	return movedOn
}

// take waits until the budgets of p and of the node have room for q's
// tensors, and takes it.
func (e *Engine) take(p *PeerFlow, q *queued) error {
	n := q.in.Bytes()
	if n == 0 {
		return nil
	}
	if err := p.budget.acquire(e.ctx, p.done, n); err != nil {
		return err
	}
	if err := e.budget.acquire(e.ctx, p.done, n); err != nil {
		p.budget.release(n)
		return err
	}
	q.held = n
	return nil
}

// fetchNow fetches q's tensors within the transfer timeout.
func (e *Engine) fetchNow(p *PeerFlow, q *queued) error {
	if q.in == nil {
		return nil
	}
	// Without a timer unless something waits on Done (a fetch that polls
	// ctx.Err does not): this runs once per message.
	ctx, cancel := deadline.WithTimeout(e.ctx, e.cfg.Flow.TransferTimeout)
	defer cancel()
	return q.in.fetch(ctx, p.inbox.fetchedOne)
}

// deliverFetched delivers q, whose fetch ended with err, gives its budget
// back and then releases the leases of what it fetched.
func (e *Engine) deliverFetched(p *PeerFlow, q *queued, err error) {
	e.releaseBudget(p, q)
	q.deliver.Deliver(err)
	e.afterDelivery(p, q, err)
}

// releaseBudget gives back the budget q took.
func (e *Engine) releaseBudget(p *PeerFlow, q *queued) {
	if q.held > 0 {
		p.budget.release(q.held)
		e.budget.release(q.held)
		q.held = 0
	}
}

// afterDelivery releases the leases of what q fetched (err nil) and counts
// q out of p's backlog: q is in its place downstream.
func (e *Engine) afterDelivery(p *PeerFlow, q *queued, err error) {
	if err == nil && q.in != nil {
		q.in.releaseFetched(e.ctx)
	}
	p.inbox.pending.Add(-1)
}

// abortQueued reports q failed without fetching it.
func (e *Engine) abortQueued(p *PeerFlow, q *queued, err error) {
	if q.in != nil {
		p.inbox.fetchedOne()
		q.in.Abort()
	}
	q.deliver.Deliver(err)
	p.inbox.pending.Add(-1)
}

// abortInbox fails the messages still in p's inbox, and any queued later.
func (e *Engine) abortInbox(p *PeerFlow) {
	err := fmt.Errorf("%w: %s", ErrPeerDown, p.name)
	for _, q := range p.inbox.close() {
		e.abortQueued(p, q, err)
	}
}
