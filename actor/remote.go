package actor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/transfer"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// DeliveryFailed is sent to the sender of a message that could not be
// delivered (node down, encoding failed, a tensor could not be fetched...).
// A future waiting on such a request fails at once with
// actor.ErrDeadLetter instead; the reason is logged.
type DeliveryFailed struct {
	Target *pa.PID
	Reason string
}

// Error implements error.
func (d *DeliveryFailed) Error() string {
	return fmt.Sprintf("actor: message to %v not delivered: %s", d.Target, d.Reason)
}

// remoteProcess is the protoactor Process of every PID on another node.
type remoteProcess struct {
	n    *Node
	node string
	// last is the node's peer state as the snapshot last.snap had it:
	// a send finds its peer without a map lookup while the peers do not
	// change.
	last atomic.Pointer[remotePeer]
}

// remotePeer is remoteProcess.last.
type remotePeer struct {
	snap *map[string]*peerState
	ps   *peerState
}

// peer returns the state of r's node if it is up, as Node.peer does.
func (r *remoteProcess) peer() *peerState {
	snap := r.n.peerSnap.Load()
	if l := r.last.Load(); l != nil && l.snap == snap {
		return l.ps
	}
	var ps *peerState
	if snap != nil {
		ps = (*snap)[r.node]
	}
	r.last.Store(&remotePeer{snap: snap, ps: ps})
	return ps
}

var _ pa.Process = (*remoteProcess)(nil)

// resolve is the ActorSystem's address resolver: a PID whose Address is a
// node of the cluster resolves to that node's remote process.
func (n *Node) resolve(pid *pa.PID) (pa.Process, bool) {
	if n.members == nil {
		return nil, false
	}
	rp := n.remote(pid.Address)
	return rp, rp != nil
}

// remote returns the remote process of node, nil if it is neither
// another node of the config nor one the membership knows now (a node
// announced by discovery).
func (n *Node) remote(node string) *remoteProcess {
	if rp := n.remotes[node]; rp != nil {
		return rp // one per node of the config, made once
	}
	if node == n.self.Name || n.members == nil || !n.members.Known(node) {
		return nil
	}
	// Made per call, kept nowhere but in the PID that resolves to it:
	// names that come and go leave nothing behind.
	return &remoteProcess{n: n, node: node}
}

func (r *remoteProcess) SendUserMessage(pid *pa.PID, message any) {
	header, msg, sender := pa.UnwrapEnvelope(message)
	r.n.sendUserVia(context.Background(), r.peer(), pid, header, msg, sender)
}

func (r *remoteProcess) SendSystemMessage(pid *pa.PID, message any) {
	r.n.sendSystem(pid, message)
}

func (r *remoteProcess) Stop(pid *pa.PID) { r.n.sendSystem(pid, &pa.Stop{}) }

func isFuture(pid *pa.PID) bool { return pid != nil && strings.HasPrefix(pid.Id, "future") }

// bodyBuffers are scratch buffers for message bodies: the connection
// copies a body into its batch before SendMessage returns.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledBody is the largest body buffer kept for reuse.
const maxPooledBody = 64 << 10

// sendUserVia sends msg to target on another node through ps, target's
// peer (nil: it is looked up, connecting if need be); ctx (or else header)
// holds the trace the send continues, when the node traces.
func (n *Node) sendUserVia(ctx context.Context, ps *peerState, target *pa.PID, header pa.ReadonlyMessageHeader, msg any, sender *pa.PID) {
	sp := n.startSend(ctx, header, target, msg)
	var err error
	if ps == nil {
		ps, err = n.connectedPeer(target.Address)
	}
	if ps == nil {
		sp.End(err)
		n.failDelivery(target, sender, err)
		return
	}
	// The engine takes the tensors out of the message (one walk, known
	// per type) into the table that travels beside the body.
	out, err := n.eng.ExportContext(sp.Context(), target.Address, msg)
	if err != nil {
		err = fmt.Errorf("sending %T: %w", msg, err)
		sp.End(err)
		n.failDelivery(target, sender, err)
		return
	}
	pending := isFuture(sender) && sender.Address == n.self.Name && !isReply(sender.Id)
	if out == nil && !ps.ep.Backlogged() {
		var m wire.Message
		fillMessage(&m, target, header, sender)
		m.Header = sp.Inject(m.Header)
		sp.End(n.sendPlain(ps, &m, msg, target, sender, pending))
	} else {
		n.sendQueued(ps, out, msg, target, header, sender, pending, sp)
	}
	if pending {
		// A protoactor future now waits for the reply. If the sender is
		// an inline handler running on this peer's connection reader, no
		// one else reads that reply: the reading moves on now.
		ps.peer.ExpectReply()
	}
}

// fillMessage addresses m. A reply to a Request goes with the request's
// key alone (no target): the receiver needs no string for it.
func fillMessage(m *wire.Message, target *pa.PID, header pa.ReadonlyMessageHeader, sender *pa.PID) {
	if key, ok := replyKey(target.Id); ok && key != 0 {
		m.Request = key
	} else {
		m.Target = target.Id
	}
	if sender != nil {
		m.SenderNode, m.SenderID = sender.Address, sender.Id
	}
	if header != nil && header.Length() > 0 {
		m.Header = header.ToMap()
	}
}

// outMessage is a message with tensors (or behind such messages) that the
// engine sends when the peer's credits allow (transfer.Message).
type outMessage struct {
	n              *Node
	ps             *peerState
	target, sender *pa.PID
	pending        bool
	m              wire.Message
	span           tracehook.Span // the send's, ended once sent or failed
}

// sendQueued hands a message with tensors, or one behind such messages, to
// the engine, which sends it in order and never blocks the sender (the
// body is encoded now, into its own buffer).
func (n *Node) sendQueued(ps *peerState, out *transfer.Outgoing, msg any, target *pa.PID, header pa.ReadonlyMessageHeader, sender *pa.PID, pending bool, sp tracehook.Span) {
	if sender != nil && isReply(sender.Id) {
		// A Request's sender lives in its pooled wait (requestRemote),
		// which a request that ends before this send reuses.
		sender = pa.NewPID(sender.Address, sender.Id)
	}
	om := &outMessage{n: n, ps: ps, target: target, sender: sender, pending: pending, span: sp}
	fillMessage(&om.m, target, header, sender)
	om.m.Header = sp.Inject(om.m.Header)
	var err error
	om.m.Type, om.m.Ser, om.m.Body, err = registry.AppendEncode(nil, msg)
	if err != nil {
		out.Abort()
		err = fmt.Errorf("encoding %T: %w", msg, err)
		sp.End(err)
		n.failDelivery(target, sender, err)
		return
	}
	if out != nil {
		om.m.Tensors = out.Table
	}
	n.eng.Send(target.Address, out, om)
}

// Send implements transfer.Message.
func (o *outMessage) Send() error {
	if o.pending {
		o.ps.addPending(o.sender)
	}
	if err := o.ps.peer.SendMessage(o.n.ctx, &o.m); err != nil {
		if o.pending && !o.ps.removePending(o.sender) {
			o.sender = nil // PeerDown failed the future: Fail only logs
		}
		return err
	}
	o.n.stats.MessagesSent.Add(1)
	o.span.End(nil)
	return nil
}

// Fail implements transfer.Message.
func (o *outMessage) Fail(err error) {
	o.span.End(err)
	o.n.failDelivery(o.target, o.sender, err)
}

// sendPlain sends a message without tensors, encoding its body into a
// pooled buffer (the connection copies it before SendMessage returns). It
// returns why the message was not sent (reported to its sender already).
func (n *Node) sendPlain(ps *peerState, m *wire.Message, msg any, target, sender *pa.PID, pending bool) error {
	buf := bodyBuffers.Get().(*[]byte)
	defer func() {
		if cap(m.Body) <= maxPooledBody {
			*buf = m.Body[:0]
		}
		bodyBuffers.Put(buf)
	}()
	var err error
	m.Type, m.Ser, m.Body, err = registry.AppendEncode((*buf)[:0], msg)
	if err != nil {
		m.Body = (*buf)[:0]
		err = fmt.Errorf("encoding %T: %w", msg, err)
		n.failDelivery(target, sender, err)
		return err
	}
	if pending {
		ps.addPending(sender)
	}
	// SendMessage blocks only while the connection's queue is full:
	// backpressure until the peer drains it or is declared down.
	if err := ps.peer.SendMessage(n.ctx, m); err != nil {
		if pending && !ps.removePending(sender) {
			sender = nil // PeerDown failed the future: only log
		}
		n.failDelivery(target, sender, err)
		return err
	}
	n.stats.MessagesSent.Add(1)
	return nil
}

// failDelivery reports a message that could not be delivered to its sender;
// without a sender the failure is logged.
func (n *Node) failDelivery(target, sender *pa.PID, err error) {
	n.stats.DeliveryFailures.Add(1)
	n.log.Warn("message not delivered", zap.Stringer("target", target), zap.Stringer("sender", sender), zap.Error(err))
	if sender == nil || n.completeReply(sender.Id, nil, fmt.Errorf("%w: %w", ErrDeadLetter, err)) {
		return
	}
	var reply any = &DeliveryFailed{Target: target, Reason: err.Error()}
	if isFuture(sender) {
		reply = &pa.DeadLetterResponse{Target: target}
	}
	n.system.Root.Send(sender, reply)
}

func (n *Node) sendSystem(target *pa.PID, message any) {
	s := wire.System{Target: target.Id}
	switch m := message.(type) {
	case *pa.Watch:
		if !n.addWatch(target, m.Watcher) {
			n.terminated(m.Watcher, target, pa.TerminatedReason_AddressTerminated)
			return
		}
		s.Kind, s.AboutNode, s.AboutID = wire.SystemWatch, m.Watcher.Address, m.Watcher.Id
	case *pa.Unwatch:
		n.removeWatch(target, m.Watcher)
		s.Kind, s.AboutNode, s.AboutID = wire.SystemUnwatch, m.Watcher.Address, m.Watcher.Id
	case *pa.Terminated:
		// target is the remote watcher; Who is the local actor that ended.
		n.removeWatcher(target.Address, m.Who.Id, target.Id)
		s.Kind, s.AboutNode, s.AboutID, s.Why = wire.SystemTerminated, m.Who.Address, m.Who.Id, int32(m.Why)
	case *pa.Stop:
		s.Kind = wire.SystemStop
	default:
		n.log.Warn("system message not supported across nodes", zap.Stringer("target", target), zap.String("type", fmt.Sprintf("%T", message)))
		return
	}
	ps, _ := n.connectedPeer(target.Address)
	if ps == nil {
		if s.Kind == wire.SystemWatch {
			n.removeWatch(target, message.(*pa.Watch).Watcher)
			n.terminated(message.(*pa.Watch).Watcher, target, pa.TerminatedReason_AddressTerminated)
		}
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.Flow.TransferTimeout)
	defer cancel()
	if err := ps.peer.Send(ctx, wire.FrameSystem, 0, 0, &s); err != nil && !errors.Is(err, cluster.ErrClosed) {
		n.log.Warn("system message not sent", zap.Stringer("target", target), zap.Stringer("kind", s.Kind), zap.Error(err))
	}
}

// terminated tells a local watcher that who has ended.
func (n *Node) terminated(watcher, who *pa.PID, why pa.TerminatedReason) {
	proc, _ := n.system.ProcessRegistry.Get(watcher)
	proc.SendSystemMessage(watcher, &pa.Terminated{Who: who, Why: why})
}
