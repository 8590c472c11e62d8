package transfer

import (
	"context"
	"fmt"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Channel set-up requests travel as Message frames with these reserved type
// names; Target names the channel and Request pairs a reply with its request.
const (
	ctlRequestType = "$tensorferry.ctl"
	ctlReplyType   = "$tensorferry.ctlreply"
)

// IsControl reports whether a message of the named type is a channel
// control request or reply, for HandleControl.
func IsControl(typeName string) bool {
	return typeName == ctlRequestType || typeName == ctlReplyType
}

// MaxControlPerPeer bounds the control requests of one peer handled at
// once. A peer that sends more waits: its connection's reader blocks in
// HandleControl until a slot frees (backpressure), and since every slot's
// reply is sent under the transfer timeout, a peer that never reads its
// replies holds at most this many goroutines for that long, never more.
const MaxControlPerPeer = 32

type ctlReply struct {
	body []byte
	err  error
}

type ctlWaiter struct {
	node string
	ch   chan ctlReply
}

// control sends req to the named channel of node and waits for its reply.
func (e *Engine) control(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
	p := e.peer(node)
	if p == nil {
		return nil, fmt.Errorf("%w: %s", ErrPeerDown, node)
	}
	id := e.ctlSeq.Add(1)
	ch := make(chan ctlReply, 1)
	e.ctlMu.Lock()
	e.ctlWait[id] = ctlWaiter{node: node, ch: ch}
	e.ctlMu.Unlock()
	defer func() {
		e.ctlMu.Lock()
		delete(e.ctlWait, id)
		e.ctlMu.Unlock()
	}()
	m := &wire.Message{Target: channel, Type: ctlRequestType, Request: id, Body: req}
	if err := p.link.Send(ctx, wire.FrameMessage, 0, 0, m); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.body, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// HandleControl handles a control request or reply (IsControl) from peer.
func (e *Engine) HandleControl(peer string, m *wire.Message) {
	p := e.peer(peer)
	if p == nil {
		return
	}
	if m.Type == ctlReplyType {
		e.ctlMu.Lock()
		w, ok := e.ctlWait[m.Request]
		e.ctlMu.Unlock()
		if ok && w.node == peer {
			// Not blocking: a peer that answers one request twice must
			// not stall this reader on the full one-reply channel.
			select {
			case w.ch <- ctlReply{body: append([]byte(nil), m.Body...)}:
			default:
			}
		}
		return
	}
	// One slot of the peer's MaxControlPerPeer; the reader waits here
	// when all are taken.
	select {
	case p.ctlSlots <- struct{}{}:
	default:
		e.stats.controlWaits.Add(1)
		select {
		case p.ctlSlots <- struct{}{}:
		case <-p.done:
			return
		case <-e.ctx.Done():
			return
		}
	}
	var h rdma.ControlHandler = relayHandler{e}
	ok := m.Target == relayTarget
	if !ok {
		h, ok = e.channels[m.Target].(rdma.ControlHandler)
	}
	req := append([]byte(nil), m.Body...)
	id, target := m.Request, m.Target
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() { <-p.ctlSlots }()
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.Flow.TransferTimeout)
		defer cancel()
		if !ok {
			_ = p.link.Send(ctx, wire.FrameError, 0, 0, &wire.Error{Code: wire.CodeNotFound, Stream: uint32(id), Msg: "no channel " + target + " takes control requests on " + e.cfg.Node})
			return
		}
		resp, err := h.HandleControl(ctx, peer, req)
		if err != nil {
			e.log.Info("control request refused", zap.String("peer", peer), zap.String("channel", target), zap.Error(err))
			_ = p.link.Send(ctx, wire.FrameError, 0, 0, &wire.Error{Code: wire.CodeInternal, Stream: uint32(id), Msg: err.Error()})
			return
		}
		if err := p.link.Send(ctx, wire.FrameMessage, 0, 0, &wire.Message{Type: ctlReplyType, Request: id, Body: resp}); err != nil {
			e.log.Info("control reply not sent", zap.String("peer", peer), zap.String("channel", target), zap.Error(err))
		}
	}()
}

// HandleError takes an error frame from peer: the answer to one of this
// node's control requests; others are logged.
func (e *Engine) HandleError(peer string, m *wire.Error) {
	e.ctlMu.Lock()
	w, ok := e.ctlWait[uint64(m.Stream)]
	e.ctlMu.Unlock()
	if ok && w.node == peer {
		select {
		case w.ch <- ctlReply{err: fmt.Errorf("%w: %s: %s: %s", ErrControl, peer, m.Code, m.Msg)}:
		default: // answered already
		}
		return
	}
	e.log.Warn("error from peer", zap.String("peer", peer), zap.Stringer("code", m.Code), zap.String("msg", m.Msg))
}

// failControls fails the control requests waiting on a peer that went down.
func (e *Engine) failControls(peer string) {
	e.ctlMu.Lock()
	defer e.ctlMu.Unlock()
	for _, w := range e.ctlWait {
		if w.node != peer {
			continue
		}
		select {
		case w.ch <- ctlReply{err: fmt.Errorf("%w: %s", ErrPeerDown, peer)}:
		default:
		}
	}
}

// relayHandler takes the relay requests of peers (relay.go) as a channel
// takes its control requests.
type relayHandler struct{ e *Engine }

func (h relayHandler) HandleControl(ctx context.Context, peer string, req []byte) ([]byte, error) {
	return h.e.serveRelay(ctx, peer, req)
}
