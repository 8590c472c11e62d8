package actor

import (
	"runtime"
	"sync"
	"sync/atomic"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/internal/park"
)

// WithInlineDelivery is a props option for actors spawned on n: a message
// from another node that arrives alone in its frame (request/response
// traffic, as opposed to a burst, which arrives batched) and finds the
// actor idle runs the actor's handler at once on the goroutine reading the
// connection (its reader goroutine, or a Node.Request caller reading its
// own reply meanwhile), instead of on a goroutine started for it. That saves the
// hand-off to the actor and, for a request, the one back to the writer:
// about a third of a loopback round trip on a small virtual machine.
//
// The handler may still block (a request of its own, a lock): a handler
// that runs longer than the config's transport.handler_takeover (10ms by
// default, config.TransportConfig.HandlerTakeover) hands the connection's
// reading to a new goroutine, so the frames behind it wait at most that
// long and a handler that waits for a reply from the same node does not
// deadlock. One that waits through Node.Request, or through a protoactor
// future (RequestFuture to an actor of another node), hands the reading on
// at once, without waiting for handler_takeover. A message whose tensors the
// engine fetches, when it arrives alone (nothing else from its node queued
// or being fetched) and finds the actor idle, runs where the engine
// fetched it: on the connection's reader when its one tensor (up to
// transfer.ReaderFetchMax) came by ipc from an allocation already mapped,
// as a message without tensors does; otherwise on the engine's goroutine,
// after the engine has moved the delivery of that node's next messages to
// another goroutine. Either way the tensors' leases go back before the
// handler runs, so a handler that waits for a reply with tensors from the
// same node does not deadlock.
// Batched messages (a burst) are run by the props' dispatcher; with
// config transport.burst_decode (by default on a host with 8 processors
// or more), those without tensors are also decoded there, off the
// connection's reader, which a burst keeps busy. Local senders and system
// messages go through the dispatcher as usual; the actor still handles
// one message at a time, in order. At most the dispatcher's throughput of
// messages run on the delivering goroutine at a time; the rest go to the
// dispatcher. With
// config transport.inline_delivery off, the actor gets protoactor's
// default mailbox instead.
//
//	props := pa.PropsFromFunc(echo, node.WithInlineDelivery()) // pa: protoactor-go/actor
func (n *Node) WithInlineDelivery() pa.PropsOption {
	if !n.cfg.Transport.InlineDelivery.On(true) {
		return pa.WithMailbox(pa.Unbounded())
	}
	return pa.WithMailbox(func() pa.Mailbox {
		return &onReaderMailbox{n: n, gone: make(chan struct{})}
	})
}

// onReaderMailboxes maps the ids of n's actors with inline delivery to their
// mailboxes; an entry lives from spawn to the actor's Stop.
type onReaderMailboxes struct {
	count atomic.Int64
	byID  sync.Map // string → *onReaderMailbox
}

// Mailbox states (as in protoactor's default mailbox).
const (
	mailboxIdle int32 = iota
	mailboxRunning
)

// onReaderMailbox is the inline mailbox of WithInlineDelivery: protoactor's
// default unbounded mailbox, whose user messages may also be run on the
// goroutine that posts them (postOnReader: a connection's reader, or the
// engine's goroutine that fetched the message's tensors), and in which
// readers queue at most maxReaderBacklog user messages (waitRoom).
type onReaderMailbox struct {
	n          *Node
	id         string
	proc       pa.Process
	invoker    pa.MessageInvoker
	dispatcher pa.Dispatcher

	user   messageQueue
	system messageQueue

	status       atomic.Int32
	userMessages atomic.Int32
	sysMessages  atomic.Int32
	suspended    atomic.Bool
	registered   atomic.Bool

	// A connection's reader that finds maxReaderBacklog user messages
	// queued waits (waitRoom) until the actor has run half of them: a
	// peer cannot grow the mailbox without bound, and one that sends
	// without reading the replies stalls its own connection (then loses
	// it to the failure detector), not the node's memory.
	room     park.Gate     // opened when the backlog falls below half
	gone     chan struct{} // closed by unregister: nobody waits for room
	goneOnce sync.Once
}

// maxReaderBacklog bounds the user messages a connection's reader (or the
// engine's delivery) queues in an inline mailbox (64 Ki messages) before it
// waits for the actor.
const maxReaderBacklog = 1 << 16

// waitRoom blocks the calling reader while the mailbox holds
// maxReaderBacklog user messages or more, until the actor has run half of
// them, the actor stops, or the node does. It reports whether it waited.
func (m *onReaderMailbox) waitRoom() bool {
	if m.userMessages.Load() < maxReaderBacklog {
		return false
	}
	m.n.stats.InlineBackpressure.Add(1)
	// Several readers (one per peer) may wait at once: a run that takes
	// the backlog below half opens the gate to all of them (roomFreed).
	for m.userMessages.Load() >= maxReaderBacklog {
		if !m.room.Wait(m.hasRoom, m.gone, m.n.ctx.Done()) {
			return true
		}
	}
	return true
}

func (m *onReaderMailbox) hasRoom() bool { return m.userMessages.Load() < maxReaderBacklog }

// roomFreed wakes the readers waiting for room once the backlog is below
// half; the run took the message off the count first (a read-modify-write,
// as package park asks).
func (m *onReaderMailbox) roomFreed() {
	if m.userMessages.Load() < maxReaderBacklog/2 {
		m.room.Open()
	}
}

var _ pa.Mailbox = (*onReaderMailbox)(nil)

// RegisterHandlers implements pa.Mailbox. protoactor calls it once the
// actor's PID is registered, which is when the mailbox learns its id.
func (m *onReaderMailbox) RegisterHandlers(invoker pa.MessageInvoker, dispatcher pa.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	ctx, ok := invoker.(pa.Context)
	if !ok || ctx.ActorSystem() != m.n.system || ctx.Self() == nil {
		return // not spawned on the node: an ordinary mailbox
	}
	proc, ok := m.n.system.ProcessRegistry.GetLocal(ctx.Self().Id)
	if !ok {
		return
	}
	m.id, m.proc = ctx.Self().Id, proc
	m.n.onReader.byID.Store(m.id, m)
	m.n.onReader.count.Add(1)
	m.registered.Store(true)
}

// unregister forgets the mailbox when the actor is told to stop: later
// messages take the dispatcher path, which the stopping actor still serves.
func (m *onReaderMailbox) unregister() {
	m.goneOnce.Do(func() { close(m.gone) })
	if m.registered.CompareAndSwap(true, false) {
		if m.n.onReader.byID.CompareAndDelete(m.id, m) {
			m.n.onReader.count.Add(-1)
		}
	}
}

// Start implements pa.Mailbox.
func (m *onReaderMailbox) Start() {}

// UserMessageCount implements pa.Mailbox.
func (m *onReaderMailbox) UserMessageCount() int { return int(m.userMessages.Load()) }

// PostUserMessage implements pa.Mailbox: the message is run by the
// dispatcher.
func (m *onReaderMailbox) PostUserMessage(message any) { m.post(message) }

// postOnReader posts message and, if the mailbox was idle, runs it (and up to
// the dispatcher's throughput of messages) on the calling goroutine, after
// calling mayBlock: the message has its place in the mailbox, so the
// connection's reader may be taken over while the actor runs
// (wire.Conn.MayBlock).
func (m *onReaderMailbox) postOnReader(message any, mayBlock func()) {
	m.waitRoom()
	if isBatch(message) {
		m.post(message) // unpacked, run by the dispatcher
		return
	}
	m.push(message)
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		mayBlock()
		m.n.stats.MessagesInline.Add(1)
		m.process(true)
	}
}

func (m *onReaderMailbox) post(message any) {
	// Batches are unpacked as protoactor's default mailbox does: their
	// messages, then the batch itself.
	if batch, ok := message.(pa.MessageBatch); ok {
		for _, msg := range batch.GetMessages() {
			m.post(msg)
		}
	}
	if env, ok := message.(*pa.MessageEnvelope); ok {
		if batch, ok := env.Message.(pa.MessageBatch); ok {
			for _, msg := range batch.GetMessages() {
				m.post(msg)
			}
		}
	}
	m.push(message)
	m.schedule()
}

// push queues message as a user message.
func (m *onReaderMailbox) push(message any) {
	m.user.push(message)
	m.userMessages.Add(1)
}

// postMany posts msgs, in order, to be run by the dispatcher: one lock and
// at most one schedule for the lot.
func (m *onReaderMailbox) postMany(msgs []any) {
	m.waitRoom()
	start := 0
	for i, msg := range msgs {
		if isBatch(msg) {
			m.pushMany(msgs[start:i])
			m.post(msg)
			start = i + 1
		}
	}
	m.pushMany(msgs[start:])
}

func (m *onReaderMailbox) pushMany(msgs []any) {
	if len(msgs) == 0 {
		return
	}
	m.user.pushMany(msgs)
	m.userMessages.Add(int32(len(msgs)))
	m.schedule()
}

// isBatch reports whether msg is a protoactor MessageBatch, bare or in an
// envelope (the mailbox unpacks those).
func isBatch(msg any) bool {
	if env, ok := msg.(*pa.MessageEnvelope); ok {
		msg = env.Message
	}
	_, ok := msg.(pa.MessageBatch)
	return ok
}

// PostSystemMessage implements pa.Mailbox.
func (m *onReaderMailbox) PostSystemMessage(message any) {
	if _, ok := message.(*pa.Stop); ok {
		m.unregister()
	}
	m.system.push(message)
	m.sysMessages.Add(1)
	m.schedule()
}

func (m *onReaderMailbox) schedule() {
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		m.dispatcher.Schedule(m.processScheduled)
	}
}

func (m *onReaderMailbox) processScheduled() { m.process(false) }

// process runs messages until the mailbox is empty (or suspended). Run on
// the posting goroutine (onReader), it stops after the dispatcher's
// throughput and leaves the rest to the dispatcher, the mailbox still
// marked running.
func (m *onReaderMailbox) process(onReader bool) {
	for {
		if !m.run(onReader) {
			m.dispatcher.Schedule(m.processScheduled)
			return
		}
		// Published before the counts are read again: a poster counts,
		// then tries to schedule (package park says why not a Store).
		park.Publish32(&m.status, mailboxIdle)
		sys, user := m.sysMessages.Load(), m.userMessages.Load()
		// Messages posted after run found the queues empty.
		if sys > 0 || (!m.suspended.Load() && user > 0) {
			if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
				continue
			}
		}
		return
	}
}

// run processes messages, system ones first, until none is left (true) or,
// on the posting goroutine (onReader), until the throughput is spent
// (false). A panic in the actor is
// escalated to its supervisor, as in protoactor's mailbox.
func (m *onReaderMailbox) run(onReader bool) (drained bool) {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			drained = true
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	i, t := 0, m.dispatcher.Throughput()
	for {
		if i > t {
			if onReader {
				return false
			}
			i = 0
			runtime.Gosched()
		}
		i++
		// The counts are raised after the push, and process looks at them
		// again once the mailbox is idle: an empty queue skipped here on
		// a count still zero is run then, and the lock of a queue known
		// empty is not taken.
		if m.sysMessages.Load() > 0 {
			msg = m.system.pop()
		} else {
			msg = nil
		}
		if msg != nil {
			m.sysMessages.Add(-1)
			switch msg.(type) {
			case *pa.SuspendMailbox:
				m.suspended.Store(true)
			case *pa.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}
		if m.suspended.Load() {
			return true
		}
		if m.userMessages.Load() <= 0 {
			return true
		}
		if msg = m.user.pop(); msg == nil {
			return true
		}
		m.userMessages.Add(-1)
		m.roomFreed()
		if l, ok := msg.(*lazyMessage); ok {
			if msg = l.decode(); msg == nil {
				continue // reported to its sender
			}
		}
		m.invoker.InvokeUserMessage(msg)
	}
}

// messageQueue is an unbounded FIFO for many producers and one consumer
// (the goroutine running the mailbox). Producers append to in under a
// mutex; the consumer swaps in for its drained out slice, so that it takes
// the lock once per backlog rather than once per message, and the two
// slices are reused (no allocation per message once they have grown).
type messageQueue struct {
	mu   sync.Mutex
	in   []any
	out  []any // the consumer's
	next int   // next index in out
}

// maxIdleQueue is the capacity kept by an emptied slice of a messageQueue
// (256 KiB of interface values): a backlog up to it reuses warm memory.
const maxIdleQueue = 1 << 14

func (q *messageQueue) push(v any) {
	q.mu.Lock()
	q.in = append(q.in, v)
	q.mu.Unlock()
}

func (q *messageQueue) pushMany(vs []any) {
	q.mu.Lock()
	q.in = append(q.in, vs...)
	q.mu.Unlock()
}

func (q *messageQueue) pop() any {
	if q.next == len(q.out) {
		if cap(q.out) > maxIdleQueue {
			q.out = nil // give back the memory of a backlog once it is gone
		}
		q.out, q.next = q.out[:0], 0
		q.mu.Lock()
		q.in, q.out = q.out, q.in
		q.mu.Unlock()
		if len(q.out) == 0 {
			return nil
		}
	}
	v := q.out[q.next]
	q.out[q.next] = nil
	q.next++
	return v
}

// onReaderRegistered returns the inline mailbox registered under id, if any:
// registered, its process is the one protoactor's registry holds under id
// (the mailbox leaves before the process does, and a name is taken again
// only once the process has left), so a message alone in its frame needs
// no lookup in protoactor's registry.
func (n *Node) onReaderRegistered(id string) *onReaderMailbox {
	if n.onReader.count.Load() == 0 {
		return nil
	}
	v, ok := n.onReader.byID.Load(id)
	if !ok {
		return nil
	}
	if mb := v.(*onReaderMailbox); mb.registered.Load() {
		return mb
	}
	return nil
}
