package actor

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/transfer"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// A received message goes through three steps, each a function below:
//
//   - resolveTarget: who sent it and to what: a Request's reply (by key), or a
//     local actor, its process and its inline mailbox, looked up through
//     the peer's routeCache; a target that is not there refuses it;
//   - decode: its body, on the reader, or (lazy) on its actor's goroutine;
//   - route: its tensors put back (transfer.Engine.ImportInto), then
//     delivered now or handed to the engine (transfer.Engine.Accept, which
//     tells the routes apart in one place: transfer/inbox.go).
//
// Every message that is not delivered is refused in one place (refuse),
// for a named reason, and its sender hears why.

// inbound is one received message on its way through receiveMessage.
type inbound struct {
	m      *wire.Message
	sender *pa.PID
	// reply: a Request's reply, completed by key (completeReplyKey). It
	// comes with its key and no target (fillMessage); its address, new
	// for every request, becomes a string and a PID only where one is
	// needed (targetPID).
	reply  bool
	key    uint64
	target *pa.PID          // the local actor (a reply's: made by targetPID)
	proc   pa.Process       // its process (a reply's: replyProcess)
	mb     *onReaderMailbox // its inline mailbox, if it has one
	typ    *typeRoute       // what the message's type allows
	span   tracehook.Span   // its receipt's
}

// targetPID returns the message's target; a reply's target is made here,
// the one place, from its key.
func (in *inbound) targetPID(n *Node) *pa.PID {
	if in.target == nil {
		if in.m.Target == "" {
			in.m.Target = replyID(in.key)
		}
		in.target = pa.NewPID(n.self.Name, in.m.Target)
	}
	return in.target
}

// batch is what the reader keeps over the messages of one MessagesFrame:
// the actor the last one went to (consecutive messages mostly go to the
// same actor) and the messages held for an inline mailbox, not posted yet:
// a run of consecutive messages to one actor is posted at once (one lock,
// at most one goroutine started). Every other delivery of the batch posts
// them first, so nothing overtakes them. A message alone in its frame has
// none (nil).
type batch struct {
	id     string
	proc   pa.Process
	mb     *onReaderMailbox
	heldMB *onReaderMailbox
	held   []any
}

// actor returns the process of the local actor id and its inline mailbox
// (nil if it has none), through the batch's last actor (b nil: none) and
// the peer's route cache; false if there is no such actor.
func (b *batch) actor(n *Node, rc *routeCache, id string) (pa.Process, *onReaderMailbox, bool) {
	if b != nil && b.proc != nil && b.id == id {
		return b.proc, b.mb, true
	}
	var proc pa.Process
	mb := rc.onReaderMailbox(n, id)
	if mb != nil {
		proc = mb.proc // no lookup in protoactor's registry
	} else if p, ok := n.system.ProcessRegistry.GetLocal(id); ok {
		proc = p
	} else {
		return nil, nil, false
	}
	if b != nil {
		b.id, b.proc, b.mb = id, proc, mb
	}
	return proc, mb, true
}

// hold keeps msg for mb, posting what was held for another mailbox first.
func (b *batch) hold(mb *onReaderMailbox, msg any) {
	if b.heldMB != mb {
		b.flush()
		b.heldMB = mb
	}
	b.held = append(b.held, msg)
}

// flush posts the held messages.
func (b *batch) flush() {
	if b == nil || len(b.held) == 0 {
		return
	}
	b.heldMB.postMany(b.held)
	clear(b.held)
	b.held, b.heldMB = b.held[:0], nil
}

// receiveMessage handles one message from ps; b is its frame's batch (nil
// for a message alone in its frame).
func (n *Node) receiveMessage(ps *peerState, m *wire.Message, b *batch) {
	n.stats.MessagesReceived.Add(1)
	if transfer.IsControl(m.Type) {
		n.eng.HandleControl(ps.peer.Name, m)
		return
	}
	in := inbound{m: m}
	if why := n.resolveTarget(ps, &in, b); why != delivered {
		n.refuse(ps, &in, why, nil)
		return
	}
	if n.decodeLater(ps, &in, b) {
		return
	}
	msg, err := in.typ.decode(m)
	if err != nil {
		n.refuse(ps, &in, refusedNotDecoded, err)
		return
	}
	if _, poison := msg.(*pa.PoisonPill); poison && n.refuseLifecycle(ps, m.Target, "PoisonPill") {
		n.refuse(ps, &in, refusedLifecycle, nil)
		return
	}
	n.route(ps, &in, b, msg)
}

// resolveTarget finds where in goes: its sender, and its target's process and
// inline mailbox (none for a reply), or why it goes nowhere.
func (n *Node) resolveTarget(ps *peerState, in *inbound, b *batch) refusal {
	m := in.m
	if m.SenderID != "" {
		in.sender = pa.NewPID(m.SenderNode, m.SenderID)
	}
	in.typ = ps.route.typeOf(m.Type)
	if m.Request != 0 && m.Target == "" {
		in.reply, in.key = true, m.Request
	} else {
		in.key, in.reply = replyKey(m.Target)
	}
	var target string
	if n.tr.On() {
		target = in.targetPID(n).Id
	}
	in.span = n.startReceive(ps.peer.Name, m.Header, target, m.Type)
	if in.reply {
		in.proc = (*replyProcess)(n)
		return delivered
	}
	var ok bool
	if strings.HasPrefix(m.Target, "future") {
		// A reply to a protoactor future, whose id is new for every
		// request: no route cache remembers it (a lookup would only
		// miss), and no mailbox of its own that the reader could run.
		in.target = pa.NewPID(n.self.Name, m.Target)
		if !n.claimFuture(ps, in.target) {
			return refusedFutureFailed
		}
		if in.proc, ok = n.system.ProcessRegistry.GetLocal(m.Target); !ok {
			return refusedNoActor
		}
		return delivered
	}
	in.target = ps.route.target(n.self.Name, m.Target)
	if in.proc, in.mb, ok = b.actor(n, &ps.route, m.Target); !ok {
		return refusedNoActor
	}
	return delivered
}

// decodeLater holds in, a message of a batch without tensors for an actor
// with inline delivery, with its body still encoded: the actor's goroutine
// decodes it as its mailbox runs it (on hosts with processors to spare:
// Node.lazyDecode), so the reader, which a burst keeps busy, only copies
// its body. It reports false, nothing done, for any other message.
func (n *Node) decodeLater(ps *peerState, in *inbound, b *batch) bool {
	m := in.m
	if b == nil || in.mb == nil || !in.typ.lazy || len(m.Tensors) > 0 || !n.lazyDecode.Load() || n.tr.On() || ps.ep.Backlog() {
		return false
	}
	b.hold(in.mb, &lazyMessage{n: n, ps: ps, rt: in.typ.rt, ser: m.Ser, body: bytes.Clone(m.Body),
		target: in.target, sender: in.sender, header: m.Header})
	return true
}

// route puts msg's tensors back (inline tensors now; those to fetch when
// the budgets allow) and delivers it: at once, on the reader (deliverNow),
// when it has nothing to fetch and nothing of its peer waits ahead of it,
// else through the engine.
func (n *Node) route(ps *peerState, in *inbound, b *batch, msg any) {
	var inc *transfer.Incoming // nil: nothing to fetch
	if len(in.m.Tensors) > 0 || !in.typ.plain {
		var err error
		id := in.targetPID(n).Id
		if inc, err = n.eng.ImportInto(in.span.Context(), ps.peer.Name, in.m.Tensors, msg, n.deviceOf(id), n.destinationsOf(id)); err != nil {
			n.refuse(ps, in, refusedTensors, err)
			return
		}
	}
	if !ps.ep.Queues(inc) {
		n.deliverNow(ps, in, b, msg)
		return
	}
	b.flush()
	n.enqueue(ps, inc, in, msg, b == nil)
}

// deliverNow delivers msg, which has nothing to fetch, on the reader.
func (n *Node) deliverNow(ps *peerState, in *inbound, b *batch, msg any) {
	dl := n.startDelivery(in.span, &in.m.Header)
	defer dl.end()
	switch {
	case in.reply:
		b.flush()
		n.completeReplyKey(in.key, in.m.Target, msg, failedReply(msg))
	case b == nil && in.mb != nil && in.mb.registered.Load():
		// Alone in its frame, to an inline mailbox still registered after
		// the decode: run here if the actor is idle.
		in.mb.postOnReader(envelope(in.sender, in.m.Header, msg), ps.peer.HandlerMayBlock)
	case b != nil && in.mb != nil:
		b.hold(in.mb, envelope(in.sender, in.m.Header, msg))
	default:
		b.flush()
		n.deliverTo(in.proc, in.target, in.sender, in.m.Header, msg)
	}
}

// A refusal is why a received message is not delivered.
type refusal uint8

const (
	delivered           refusal = iota // not refused
	refusedFutureFailed                // its protoactor future already failed: its node went down
	refusedNoActor                     // no such actor: a dead letter
	refusedNotDecoded                  // its body does not decode
	refusedLifecycle                   // a remote PoisonPill the actor refuses (refuseLifecycle)
	refusedTensors                     // its tensor table was refused (ImportInto)
)

// refuse ends in, refused for why (err: the cause, if any): its sender
// hears why, and the tensors it lends are given back.
func (n *Node) refuse(ps *peerState, in *inbound, why refusal, err error) {
	m := in.m
	target := in.targetPID(n)
	switch why {
	case refusedFutureFailed:
		in.span.Fail("the request already failed: its node went down")
		n.log.Debug("reply to a request that failed as its node went down", zap.String("peer", ps.peer.Name), zap.String("future", target.Id))
	case refusedNoActor:
		in.span.Fail("no such actor")
		n.replyDeadLetter(ps, in.sender, target, "no such actor")
	case refusedNotDecoded:
		in.span.End(err)
		n.notDecoded(ps, m.Type, in.sender, target, err)
	case refusedLifecycle:
		in.span.Fail("remote PoisonPill refused")
		n.replyFailure(ps, in.sender, target, "remote PoisonPill refused by "+n.self.Name)
	case refusedTensors:
		in.span.End(err)
		n.log.Warn("message refused", zap.String("peer", ps.peer.Name), zap.String("type", m.Type), zap.Error(err))
		n.replyFailure(ps, in.sender, target, fmt.Sprintf("tensors of %s: %v", m.Type, err))
		return // ImportInto gave its tensors back
	}
	if len(m.Tensors) > 0 {
		n.eng.Refuse(ps.peer.Name, m.Tensors)
	}
}

// lazyMessage is a message of a batch held for an actor with inline
// delivery, its body still encoded: the actor's goroutine decodes it as
// its mailbox runs it (onReaderMailbox.run), off the connection's reader.
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

// enqueue hands in, whose tensors are to fetch (inc) or which waits behind
// messages that have some, to the engine (transfer.Engine.Accept), which
// delivers it once fetched; alone: in its frame.
func (n *Node) enqueue(ps *peerState, inc *transfer.Incoming, in *inbound, msg any, alone bool) {
	target := in.targetPID(n)
	im := &inMessage{n: n, ps: ps, target: target, sender: in.sender, header: in.m.Header, msg: msg, span: in.span}
	size := int64(len(in.m.Body) + len(in.m.Tensors))
	if err := n.eng.Accept(ps.peer.Name, inc, size, im, alone, ps.peer.HandlerMayBlock); err != nil {
		in.span.End(err)
		inc.Abort()
		n.replyFailure(ps, in.sender, target, err.Error())
	}
}

// Deliver implements transfer.Delivery: a message whose tensors the
// engine fetched (err nil) goes to its actor, or completes the Request it
// answers; otherwise its sender hears why not (a Request's caller learns
// of a failed fetch of its reply itself).
func (im *inMessage) Deliver(err error) {
	n := im.n
	if err != nil {
		im.span.End(err)
		n.log.Warn("tensor fetch failed", zap.String("peer", im.ps.peer.Name), zap.Stringer("target", im.target), zap.Error(err))
		if isReply(im.target.Id) {
			n.completeReply(im.target.Id, nil, fmt.Errorf("%w: %w", ErrReplyNotFetched, err))
		} else {
			n.replyFailure(im.ps, im.sender, im.target, "fetching tensors: "+err.Error())
		}
		return
	}
	dl := n.startDelivery(im.span, &im.header)
	defer dl.end()
	var proc pa.Process = (*replyProcess)(n)
	if !isReply(im.target.Id) {
		var ok bool
		if proc, ok = n.system.ProcessRegistry.GetLocal(im.target.Id); !ok {
			transfer.Discard(im.msg)
			n.replyDeadLetter(im.ps, im.sender, im.target, "actor stopped before delivery")
			return
		}
	}
	n.deliverTo(proc, im.target, im.sender, im.header, im.msg)
}

// DeliverInline implements transfer.InlineDelivery: a message for an actor
// with inline delivery (WithInlineDelivery) that finds it idle runs on the
// engine's goroutine, which calls handoff (the engine's delivery of the
// peer's next messages moves to another goroutine) before the handler runs.
// Anything else is delivered as Deliver does.
func (im *inMessage) DeliverInline(err error, handoff func()) {
	n := im.n
	var mb *onReaderMailbox
	if err == nil && !isReply(im.target.Id) {
		mb = im.ps.route.onReaderMailbox(n, im.target.Id)
	}
	if mb == nil {
		im.Deliver(err)
		return
	}
	dl := n.startDelivery(im.span, &im.header)
	mb.postOnReader(envelope(im.sender, im.header, im.msg), handoff)
	dl.end()
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
	n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: sender.Id, AboutNode: target.Address, AboutID: target.Id, Detail: why, Why: wire.DeadLetterNoActor})
}

// replyFailure tells the sender that its message could not be delivered.
func (n *Node) replyFailure(ps *peerState, sender, target *pa.PID, why string) {
	n.stats.DeliveryFailures.Add(1)
	if sender == nil {
		return
	}
	n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: sender.Id, AboutNode: target.Address, AboutID: target.Id, Detail: why, Why: wire.DeadLetterFailed})
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
		watcher := pa.NewPID(s.AboutNode, s.AboutID)
		proc, ok := n.system.ProcessRegistry.GetLocal(s.Target)
		if !ok {
			n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemTerminated, Target: watcher.Id, AboutNode: n.self.Name, AboutID: s.Target, Why: int32(pa.TerminatedReason_NotFound)})
			return
		}
		if err := n.addWatcher(ps, s.Target, s.AboutNode, s.AboutID); err != nil {
			n.log.Warn("watch refused", zap.String("peer", ps.peer.Name), zap.String("actor", s.Target), zap.Error(err))
			n.sendSystemFrame(ps, &wire.System{Kind: wire.SystemDeadLetter, Target: s.AboutID, AboutNode: n.self.Name, AboutID: s.Target, Detail: err.Error(), Why: wire.DeadLetterFailed})
			return
		}
		proc.SendSystemMessage(local, &pa.Watch{Watcher: watcher})
	case wire.SystemUnwatch:
		if s.AboutNode != ps.peer.Name {
			return // only the peer's own watchers are its to remove
		}
		n.removeWatcher(ps.peer.Name, s.Target, s.AboutID)
		if proc, ok := n.system.ProcessRegistry.GetLocal(s.Target); ok {
			proc.SendSystemMessage(local, &pa.Unwatch{Watcher: pa.NewPID(s.AboutNode, s.AboutID)})
		}
	case wire.SystemTerminated:
		who := pa.NewPID(s.AboutNode, s.AboutID)
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
		if n.completeReply(s.Target, nil, fmt.Errorf("%w: %s/%s: %s", ErrDeadLetter, s.AboutNode, s.AboutID, s.Detail)) {
			return
		}
		if isFuture(local) && !n.claimFuture(ps, local) {
			return // PeerDown failed it already
		}
		target := pa.NewPID(s.AboutNode, s.AboutID)
		var reply any = &pa.DeadLetterResponse{Target: target}
		if s.Why == wire.DeadLetterFailed && !isFuture(local) {
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
