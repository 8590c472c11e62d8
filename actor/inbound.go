package actor

import (
	"bytes"
	"context"
	"fmt"
	"reflect"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/transfer"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// procCache remembers the last actor a batch delivered to: consecutive
// messages of a batch mostly go to the same actor. It lives for one frame.
type procCache struct {
	id   string
	proc pa.Process
	// typeName carries no tensors when plain is set (the batch's last
	// type); lazy: and it may be decoded by the actor's goroutine
	// (lazyMessage).
	typeName string
	rt       *wire.RegisteredType // typeName's registration; nil if none
	plain    bool
	lazy     bool
	// The inline mailbox (or none) of the process last looked up.
	mbProc pa.Process
	mb     *inlineMailbox
	// held are messages for held, an inline mailbox, not posted yet: a
	// run of consecutive messages to one actor is posted at once (one
	// lock, at most one goroutine started). Every other delivery of the
	// batch posts them first, so nothing overtakes them.
	heldMB *inlineMailbox
	held   []any
}

// inline returns the inline mailbox of proc (registered under id), or nil.
func (c *procCache) inline(n *Node, id string, proc pa.Process) *inlineMailbox {
	if c.mbProc != proc {
		c.mbProc, c.mb = proc, n.inlineFor(id, proc)
	}
	return c.mb
}

// hold keeps msg for mb, posting what was held for another mailbox first.
func (c *procCache) hold(mb *inlineMailbox, msg any) {
	if c.heldMB != mb {
		c.flush()
		c.heldMB = mb
	}
	c.held = append(c.held, msg)
}

// flush posts the held messages.
func (c *procCache) flush() {
	if c == nil || len(c.held) == 0 {
		return
	}
	c.heldMB.postMany(c.held)
	clear(c.held)
	c.held, c.heldMB = c.held[:0], nil
}

// noTensors reports whether messages of the named type certainly carry no
// tensors, remembering the answer for the next message of the batch.
func (c *procCache) noTensors(name string) bool {
	if c == nil {
		return false
	}
	c.see(name)
	return c.plain
}

// lazyType reports whether messages of the named type may be decoded by
// their actor's goroutine (lazyMessage): registered, without tensors, and
// not a lifecycle message (a PoisonPill is checked on the reader).
func (c *procCache) lazyType(name string) bool {
	c.see(name)
	return c.lazy
}

var poisonPillType = reflect.TypeFor[pa.PoisonPill]()

// see makes the named type the batch's current one, looking its
// registration up when the name changes (a registration never does; the
// zero procCache is what lookup("") gives, no registration).
func (c *procCache) see(name string) {
	if c.typeName != name {
		c.lookup(name)
	}
}

// lookup remembers the registration of the named type and what it allows.
func (c *procCache) lookup(name string) {
	rt, ok := registry.Type(name)
	c.typeName, c.rt, c.plain, c.lazy = name, rt, false, false
	if ok {
		c.plain = !transfer.HoldsTensors(rt.Type())
		c.lazy = c.plain && rt.Type() != poisonPillType
	}
}

// decode decodes m through the registration of its type, which a batch
// looks up once per run of messages of one type (Registry.Decode looks it
// up by name each time); alone in its frame (c nil), through the registry.
func (c *procCache) decode(ps *peerState, m *wire.Message) (any, error) {
	if c == nil {
		return ps.decode(m)
	}
	c.see(m.Type)
	if c.rt == nil {
		return registry.Decode(m.Type, m.Ser, m.Body) // its error names the type
	}
	return c.rt.Decode(m.Ser, m.Body)
}

func (c *procCache) get(n *Node, id string) (pa.Process, bool) {
	if c != nil && c.proc != nil && c.id == id {
		return c.proc, true
	}
	proc, ok := n.system.ProcessRegistry.GetLocal(id)
	if ok && c != nil {
		c.id, c.proc = id, proc
	}
	return proc, ok
}

// receiveMessage handles one message from ps; pc, if not nil, caches the
// target's process across the messages of one batch.
func (n *Node) receiveMessage(ps *peerState, m *wire.Message, pc *procCache) {
	n.stats.MessagesReceived.Add(1)
	if transfer.IsControl(m.Type) {
		n.eng.HandleControl(ps.peer.Name, m)
		return
	}
	var sender *pa.PID
	if m.SenderID != "" {
		sender = pa.NewPID(m.SenderNode, m.SenderID)
	}
	// A Request's reply goes to its caller by key (completeReplyKey): it
	// comes with the key and no target (fillMessage), and its address,
	// new for every request, becomes a string and a PID only where one
	// is needed (replyTarget, localPID).
	key, reply := m.Request, m.Request != 0 && m.Target == ""
	if !reply {
		key, reply = replyKey(m.Target)
	} else if n.tr.On() {
		replyTarget(m, key)
	}
	rs := n.startReceive(ps.peer.Name, m.Header, m.Target, m.Type)
	var target *pa.PID
	var proc pa.Process
	var mb *inlineMailbox // alone in its frame: the target's inline mailbox, if any
	ok := true
	if reply {
		proc = (*replyProcess)(n)
	} else {
		target = ps.target(n.self.Name, m.Target)
		if isFuture(target) && !n.claimFuture(ps, target) {
			rs.Fail("the request already failed: its node went down")
			n.log.Debug("reply to a request that failed as its node went down", zap.String("peer", ps.peer.Name), zap.String("future", target.Id))
			if len(m.Tensors) > 0 {
				n.eng.Refuse(ps.peer.Name, m.Tensors)
			}
			return
		}
		if pc == nil {
			mb = ps.inlineRegistered(n, m.Target)
		}
		if mb != nil {
			proc = mb.proc // no lookup in protoactor's registry
		} else {
			proc, ok = pc.get(n, m.Target)
		}
	}
	if !ok {
		rs.Fail("no such actor")
		n.replyDeadLetter(ps, sender, target, "no such actor")
		if len(m.Tensors) > 0 {
			n.eng.Refuse(ps.peer.Name, m.Tensors)
		}
		return
	}
	// A message of a batch, without tensors, for an actor with inline
	// delivery is decoded by the actor's goroutine as its mailbox runs it
	// (on hosts with processors to spare: Node.lazyDecode): the reader,
	// which a burst keeps busy, only copies its body.
	if pc != nil && !reply && n.lazyDecode.Load() && len(m.Tensors) == 0 && !n.tr.On() && pc.lazyType(m.Type) && !ps.ep.Backlog() {
		if mb := pc.inline(n, m.Target, proc); mb != nil {
			pc.hold(mb, &lazyMessage{n: n, ps: ps, rt: pc.rt, ser: m.Ser, body: bytes.Clone(m.Body),
				target: target, sender: sender, header: m.Header})
			return
		}
	}
	msg, err := pc.decode(ps, m)
	// A reply's address is made below only where it is used: off the path
	// of a plain reply.
	if err != nil {
		if reply {
			replyTarget(m, key)
		}
		rs.End(err)
		n.notDecoded(ps, m.Type, sender, n.localPID(target, m.Target), err)
		if len(m.Tensors) > 0 {
			n.eng.Refuse(ps.peer.Name, m.Tensors)
		}
		return
	}
	if _, poison := msg.(*pa.PoisonPill); poison {
		if reply {
			replyTarget(m, key)
		}
		if n.refuseLifecycle(ps, m.Target, "PoisonPill") {
			rs.Fail("remote PoisonPill refused")
			n.replyFailure(ps, sender, n.localPID(target, m.Target), "remote PoisonPill refused by "+n.self.Name)
			return
		}
	}
	// The engine puts the tensors back: inline ones now, those to fetch
	// when the budgets allow (in, nil when there are none).
	var in *transfer.Incoming
	if len(m.Tensors) > 0 || holdsTensors(pc, m.Type, msg) {
		if reply {
			replyTarget(m, key)
		}
		if in, err = n.eng.ImportInto(rs.Context(), ps.peer.Name, m.Tensors, msg, n.deviceOf(m.Target), n.destinationsOf(m.Target)); err != nil {
			rs.End(err)
			n.log.Warn("message refused", zap.String("peer", ps.peer.Name), zap.String("type", m.Type), zap.Error(err))
			n.replyFailure(ps, sender, n.localPID(target, m.Target), fmt.Sprintf("tensors of %s: %v", m.Type, err))
			return
		}
	}
	// Messages without tensors to fetch go straight to the mailbox unless
	// earlier ones from the same peer still wait for theirs (order holds).
	if in == nil && !ps.ep.Backlog() {
		dl := n.startDelivery(rs, &m.Header)
		if reply {
			pc.flush()
			n.completeReplyKey(key, m.Target, msg, failedReply(msg))
			dl.end()
			return
		}
		// A message alone in its frame, to an inline mailbox still
		// registered after the decode (else as the actor's process).
		if pc == nil && mb != nil && mb.registered.Load() {
			mb.postInline(envelope(sender, m.Header, msg), ps.peer.HandlerMayBlock)
			dl.end()
			return
		}
		if pc != nil {
			if mb := pc.inline(n, m.Target, proc); mb != nil {
				pc.hold(mb, envelope(sender, m.Header, msg))
				dl.end()
				return
			}
		}
		pc.flush()
		n.deliverTo(proc, target, sender, m.Header, msg)
		dl.end()
		return
	}
	pc.flush()
	if reply {
		replyTarget(m, key)
	}
	n.enqueue(ps, in, m, n.localPID(target, m.Target), sender, msg, rs, pc == nil)
}

// replyTarget gives m, a Request's reply that came with its key alone, its
// target: the reply address the key stands for.
func replyTarget(m *wire.Message, key uint64) {
	if m.Target == "" {
		m.Target = replyID(key)
	}
}

// localPID is target, or for a reply, whose target receiveMessage does not
// make, the PID of id on this node.
func (n *Node) localPID(target *pa.PID, id string) *pa.PID {
	if target == nil {
		return pa.NewPID(n.self.Name, id)
	}
	return target
}

// lazyMessage is a message of a batch held for an actor with inline
// delivery, its body still encoded: the actor's goroutine decodes it as
// its mailbox runs it (inlineMailbox.run), off the connection's reader.
// Its type carries no tensors and is not a lifecycle message.
type lazyMessage struct {
	n              *Node
	ps             *peerState
	rt             *wire.RegisteredType // its type's registration
	ser            uint8
	body           []byte // its own copy
	target, sender *pa.PID
	header         map[string]string
}

// decode returns what the mailbox runs (the message, or its envelope), or
// nil once a body that does not decode has been reported to its sender,
// as the reader reports it.
func (l *lazyMessage) decode() any {
	msg, err := l.rt.Decode(l.ser, l.body)
	if err != nil {
		l.n.notDecoded(l.ps, l.rt.Name(), l.sender, l.target, err)
		return nil
	}
	return envelope(l.sender, l.header, msg)
}

// notDecoded logs a message from ps whose body did not decode and reports
// it to its sender.
func (n *Node) notDecoded(ps *peerState, typeName string, sender, target *pa.PID, err error) {
	n.log.Warn("message not decoded", zap.String("peer", ps.peer.Name), zap.String("type", typeName), zap.Error(err))
	n.replyFailure(ps, sender, target, fmt.Sprintf("decoding %s: %v", typeName, err))
}

// holdsTensors reports whether messages of the named type (msg is one) may
// hold tensors, through the batch's cache when there is one.
func holdsTensors(pc *procCache, typeName string, msg any) bool {
	if pc != nil {
		return !pc.noTensors(typeName)
	}
	return msg != nil && transfer.HoldsTensors(reflect.TypeOf(msg))
}

// inMessage is a received message the engine delivers once its tensors
// are fetched (transfer.Delivery).
type inMessage struct {
	n              *Node
	ps             *peerState
	target, sender *pa.PID
	header         map[string]string
	msg            any
	span           tracehook.Span // its receipt's, ended at delivery
}

// enqueue queues a message with tensors to fetch, or behind such messages,
// in the engine's inbox for its peer. A message alone in its frame may
// instead be fetched and delivered on the calling goroutine, the
// connection's reader (transfer.Engine.Receive), which an actor with
// inline delivery then runs, as it runs a message without tensors.
func (n *Node) enqueue(ps *peerState, in *transfer.Incoming, m *wire.Message, target, sender *pa.PID, msg any, rs tracehook.Span, alone bool) {
	im := &inMessage{n: n, ps: ps, target: target, sender: sender, header: m.Header, msg: msg, span: rs}
	size := int64(len(m.Body) + len(m.Tensors))
	var err error
	if alone {
		err = n.eng.Receive(ps.peer.Name, in, size, im, ps.peer.HandlerMayBlock)
	} else {
		err = n.eng.Enqueue(ps.peer.Name, in, size, im)
	}
	if err != nil {
		rs.End(err)
		in.Abort()
		n.replyFailure(ps, sender, target, err.Error())
	}
}

// Deliver implements transfer.Delivery.
func (im *inMessage) Deliver(err error) {
	if err != nil {
		im.span.End(err)
		im.n.deliverFetched(im.ps, im.target, im.sender, im.header, im.msg, err)
		return
	}
	dl := im.n.startDelivery(im.span, &im.header)
	im.n.deliverFetched(im.ps, im.target, im.sender, im.header, im.msg, err)
	dl.end()
}

// DeliverInline implements transfer.InlineDelivery: a message for an actor
// with inline delivery (WithInlineDelivery) that finds it idle runs on the
// engine's goroutine, which calls handoff (the engine's delivery of the
// peer's next messages moves to another goroutine) before the handler runs.
// Anything else is delivered as Deliver does.
func (im *inMessage) DeliverInline(err error, handoff func()) {
	n := im.n
	if err != nil || isReply(im.target.Id) || n.inline.count.Load() == 0 {
		im.Deliver(err)
		return
	}
	proc, ok := n.system.ProcessRegistry.GetLocal(im.target.Id)
	if !ok {
		im.Deliver(nil) // reported to the sender as a dead letter
		return
	}
	// The process looked up once: posted inline, or as Deliver would.
	dl := n.startDelivery(im.span, &im.header)
	if mb := n.inlineFor(im.target.Id, proc); mb != nil {
		mb.postInline(envelope(im.sender, im.header, im.msg), handoff)
	} else {
		n.deliverTo(proc, im.target, im.sender, im.header, im.msg)
	}
	dl.end()
}

// deliverFetched delivers a message whose tensors the engine fetched (err
// nil) or reports why not.
func (n *Node) deliverFetched(ps *peerState, target, sender *pa.PID, header map[string]string, msg any, err error) {
	if isReply(target.Id) {
		// A reply to Node.Request: it completes the request, whose caller
		// learns of a failed fetch itself.
		if err != nil {
			n.log.Warn("tensor fetch of a reply failed", zap.String("peer", ps.peer.Name), zap.Error(err))
			n.completeReply(target.Id, nil, fmt.Errorf("%w: %w", ErrReplyNotFetched, err))
		} else {
			n.deliverTo((*replyProcess)(n), target, sender, header, msg)
		}
		return
	}
	if err != nil {
		n.log.Warn("tensor fetch failed", zap.String("peer", ps.peer.Name), zap.Stringer("target", target), zap.Error(err))
		n.replyFailure(ps, sender, target, "fetching tensors: "+err.Error())
	} else if proc, ok := n.system.ProcessRegistry.GetLocal(target.Id); ok {
		n.deliverTo(proc, target, sender, header, msg)
	} else {
		transfer.Discard(msg)
		n.replyDeadLetter(ps, sender, target, "actor stopped before delivery")
	}
}

func (n *Node) deliverTo(proc pa.Process, target, sender *pa.PID, header map[string]string, msg any) {
	proc.SendUserMessage(target, envelope(sender, header, msg))
}

// envelope is what a mailbox gets for msg: msg itself, or an envelope
// carrying its sender and header.
func envelope(sender *pa.PID, header map[string]string, msg any) any {
	if _, ok := msg.(*pa.PoisonPill); ok && sender == nil {
		return msg
	}
	if sender != nil || len(header) > 0 {
		return &pa.MessageEnvelope{Header: header, Message: msg, Sender: sender}
	}
	return msg
}

// replyDeadLetter tells the sender's node that the target does not exist, so
// a waiting future fails at once.
func (n *Node) replyDeadLetter(ps *peerState, sender, target *pa.PID, why string) {
	n.stats.DeadLetters.Add(1)
	n.log.Info("message to an absent actor", zap.Stringer("target", target), zap.Stringer("sender", sender), zap.String("why", why))
	if sender == nil {
		return
	}
	n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: sender.Id, WatcherNode: target.Address, WatcherID: target.Id, Detail: why})
}

// replyFailure tells the sender that its message could not be delivered.
func (n *Node) replyFailure(ps *peerState, sender, target *pa.PID, why string) {
	n.stats.DeliveryFailures.Add(1)
	if sender == nil {
		return
	}
	n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: sender.Id, WatcherNode: target.Address, WatcherID: target.Id, Detail: why, Why: 1})
}

func (n *Node) sendSystemFrame(ps *peerState, s *wire.System) {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.Flow.TransferTimeout)
	defer cancel()
	if err := ps.peer.Send(ctx, wire.FrameSystem, 0, 0, s); err != nil {
		n.log.Warn("system message not sent", zap.String("peer", ps.peer.Name), zap.Stringer("kind", s.Kind), zap.Error(err))
	}
}

func (n *Node) receiveSystem(ps *peerState, s *wire.System) {
	local := pa.NewPID(n.self.Name, s.Target)
	switch s.Kind {
	case wire.SystemWatch:
		watcher := pa.NewPID(s.WatcherNode, s.WatcherID)
		proc, ok := n.system.ProcessRegistry.GetLocal(s.Target)
		if !ok {
			n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemTerminated, Target: watcher.Id, WatcherNode: n.self.Name, WatcherID: s.Target, Why: int32(pa.TerminatedReason_NotFound)})
			return
		}
		if err := n.addWatcher(ps, s.Target, s.WatcherNode, s.WatcherID); err != nil {
			n.log.Warn("watch refused", zap.String("peer", ps.peer.Name), zap.String("actor", s.Target), zap.Error(err))
			n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: s.WatcherID, WatcherNode: n.self.Name, WatcherID: s.Target, Detail: err.Error(), Why: 1})
			return
		}
		proc.SendSystemMessage(local, &pa.Watch{Watcher: watcher})
	case wire.SystemUnwatch:
		if s.WatcherNode != ps.peer.Name {
			return // only the peer's own watchers are its to remove
		}
		n.removeWatcher(ps.peer.Name, s.Target, s.WatcherID)
		if proc, ok := n.system.ProcessRegistry.GetLocal(s.Target); ok {
			proc.SendSystemMessage(local, &pa.Unwatch{Watcher: pa.NewPID(s.WatcherNode, s.WatcherID)})
		}
	case wire.SystemTerminated:
		who := pa.NewPID(s.WatcherNode, s.WatcherID)
		n.removeWatch(who, local)
		n.terminated(local, who, pa.TerminatedReason(s.Why))
	case wire.SystemStop:
		if n.refuseLifecycle(ps, s.Target, "Stop") {
			return
		}
		if proc, ok := n.system.ProcessRegistry.GetLocal(s.Target); ok {
			proc.Stop(local)
		}
	case wire.SystemPoison:
		if n.refuseLifecycle(ps, s.Target, "Poison") {
			return
		}
		if proc, ok := n.system.ProcessRegistry.GetLocal(s.Target); ok {
			proc.SendUserMessage(local, &pa.PoisonPill{})
		}
	case wire.SystemDeadLetter:
		if n.completeReply(s.Target, nil, fmt.Errorf("%w: %s/%s: %s", ErrDeadLetter, s.WatcherNode, s.WatcherID, s.Detail)) {
			return
		}
		if isFuture(local) && !n.claimFuture(ps, local) {
			return // PeerDown failed it already
		}
		target := pa.NewPID(s.WatcherNode, s.WatcherID)
		var reply any = &pa.DeadLetterResponse{Target: target}
		if s.Why == 1 && !isFuture(local) {
			reply = &DeliveryFailed{Target: target, Reason: s.Detail}
		}
		if proc, ok := n.system.ProcessRegistry.GetLocal(s.Target); ok {
			proc.SendUserMessage(local, reply)
		}
	default:
		n.log.Warn("unknown system message kind", zap.String("peer", ps.peer.Name), zap.Stringer("kind", s.Kind))
	}
}

// refuseLifecycle reports whether a Stop or Poison from another node for
// local actor id is refused (logged): always for the node's own actors,
// for every actor with WithoutRemoteLifecycle.
func (n *Node) refuseLifecycle(ps *peerState, id, what string) bool {
	if id != pingActor && !n.opts.noRemoteLifecycle {
		return false
	}
	n.log.Warn("remote lifecycle message refused", zap.String("peer", ps.peer.Name), zap.String("actor", id), zap.String("message", what))
	return true
}
