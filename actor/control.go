package actor

import (
	"context"
	"errors"
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

type ctlReply struct {
	body []byte
	err  error
}

type ctlWaiter struct {
	node string
	ch   chan ctlReply
}

// ErrControl wraps errors reported by a peer's channel to a control request.
var ErrControl = errors.New("actor: channel control request failed")

// control sends req to the named channel of node and waits for its reply.
func (n *Node) control(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
	ps := n.peer(node)
	if ps == nil {
		return nil, fmt.Errorf("%w: %s", ErrNodeDown, node)
	}
	id := n.ctlSeq.Add(1)
	ch := make(chan ctlReply, 1)
	n.ctlMu.Lock()
	n.ctlWait[id] = ctlWaiter{node: node, ch: ch}
	n.ctlMu.Unlock()
	defer func() {
		n.ctlMu.Lock()
		delete(n.ctlWait, id)
		n.ctlMu.Unlock()
	}()
	m := &wire.Message{Target: channel, Type: ctlRequestType, Request: id, Body: req}
	if err := ps.peer.Send(ctx, wire.FrameMessage, 0, 0, m); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.body, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (n *Node) receiveControl(ps *peerState, m *wire.Message) {
	if m.Type == ctlReplyType {
		n.ctlMu.Lock()
		w, ok := n.ctlWait[m.Request]
		n.ctlMu.Unlock()
		if ok && w.node == ps.peer.Name {
			w.ch <- ctlReply{body: append([]byte(nil), m.Body...)}
		}
		return
	}
	h, ok := n.channels[m.Target].(rdma.ControlHandler)
	req := append([]byte(nil), m.Body...)
	id, peer := m.Request, ps.peer
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.TransferTimeout)
		defer cancel()
		if !ok {
			_ = peer.Send(ctx, wire.FrameError, 0, 0, &wire.Error{Code: wire.CodeNotFound, Stream: uint32(id), Msg: "no channel " + m.Target + " takes control requests on " + n.self.Name})
			return
		}
		resp, err := h.HandleControl(ctx, peer.Name, req)
		if err != nil {
			n.log.Info("control request refused", zap.String("peer", peer.Name), zap.String("channel", m.Target), zap.Error(err))
			_ = peer.Send(ctx, wire.FrameError, 0, 0, &wire.Error{Code: wire.CodeInternal, Stream: uint32(id), Msg: err.Error()})
			return
		}
		_ = peer.Send(ctx, wire.FrameMessage, 0, 0, &wire.Message{Type: ctlReplyType, Request: id, Body: resp})
	}()
}

func (n *Node) controlError(peer string, e *wire.Error) {
	n.ctlMu.Lock()
	w, ok := n.ctlWait[uint64(e.Stream)]
	n.ctlMu.Unlock()
	if ok && w.node == peer {
		w.ch <- ctlReply{err: fmt.Errorf("%w: %s: %s: %s", ErrControl, peer, e.Code, e.Msg)}
		return
	}
	n.log.Warn("error from peer", zap.String("peer", peer), zap.Stringer("code", e.Code), zap.String("msg", e.Msg))
}

// failControls fails the control requests waiting on a peer that went down.
func (n *Node) failControls(peer string) {
	n.ctlMu.Lock()
	defer n.ctlMu.Unlock()
	for _, w := range n.ctlWait {
		if w.node != peer {
			continue
		}
		select {
		case w.ch <- ctlReply{err: fmt.Errorf("%w: %s", ErrNodeDown, peer)}:
		default:
		}
	}
}
