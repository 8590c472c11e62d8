package actor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// fetchWindow bounds how many queued messages of one peer have their
// tensors fetched at once. Fetching several overlaps the CPU work of one
// message (offer checks, copy launch, lease release, delivery) with the
// device copies of the others, so that a stream of tensor messages keeps
// the link busy; delivery stays in arrival order.
const fetchWindow = 4

// deliverLoop fetches the tensors of queued messages from one peer, up to
// fetchWindow at once, and hands them to deliverInOrder. When the peer goes
// down, messages not yet started are aborted (their leases released, their
// tensors freed); those started are delivered once fetched, or reported
// failed.
func (n *Node) deliverLoop(ps *peerState) {
	defer n.wg.Done()
	order := make(chan *inbound, fetchWindow-1)
	var handed atomic.Int64 // messages in order or being delivered
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.deliverInOrder(ps, order, &handed)
	}()
	defer func() {
		close(order)
		wg.Wait()
	}()
	for {
		if in := ps.pop(); in != nil {
			select {
			case <-ps.done:
				// Not started: aborted with the rest.
				in.sess.abort(n.ctx)
				ps.queued.Add(-1)
				n.abortInbox(ps)
				return
			default:
			}
			if handed.Load() == 0 && ps.inboxEmpty() {
				// A lone message: fetched and delivered on this goroutine,
				// two goroutine hand-offs fewer on its way.
				n.deliverFetched(ps, in, n.fetchNow(in))
				continue
			}
			n.startFetch(in)
			// The deliverer always makes room: every fetch ends (at the
			// latest at TransferTimeout, at once when the peer is down).
			handed.Add(1)
			order <- in
			continue
		}
		select {
		case <-ps.inWake:
		case <-ps.done:
			n.abortInbox(ps)
			return
		}
	}
}

// startFetch starts fetching in's tensors; in.fetched receives the result.
func (n *Node) startFetch(in *inbound) {
	in.fetched = make(chan error, 1)
	if in.sess.empty() {
		in.fetched <- nil
		return
	}
	go func() { in.fetched <- n.fetchNow(in) }()
}

// fetchNow fetches in's tensors, within the transfer timeout.
func (n *Node) fetchNow(in *inbound) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.TransferTimeout)
	defer cancel()
	return in.sess.fetchAll(ctx)
}

// deliverInOrder delivers the messages of order in order, each once its
// tensors are fetched; handed counts those not delivered yet.
func (n *Node) deliverInOrder(ps *peerState, order <-chan *inbound, handed *atomic.Int64) {
	for in := range order {
		n.deliverFetched(ps, in, <-in.fetched)
		handed.Add(-1)
	}
}

// deliverFetched delivers in, whose fetch ended with err, or reports why
// not.
func (n *Node) deliverFetched(ps *peerState, in *inbound, err error) {
	if isReply(in.target.Id) {
		// A reply to Node.Request: it completes the request, whose caller
		// learns of a failed fetch itself.
		if err != nil {
			n.log.Warn("tensor fetch of a reply failed", zap.String("peer", ps.peer.Name), zap.Error(err))
			n.completeReply(in.target.Id, nil, fmt.Errorf("%w: %w", ErrReplyNotFetched, err))
		} else {
			n.deliver((*replyProcess)(n), in)
		}
		ps.queued.Add(-1)
		return
	}
	if err != nil {
		n.log.Warn("tensor fetch failed", zap.String("peer", ps.peer.Name), zap.Stringer("target", in.target), zap.Error(err))
		n.replyFailure(ps, in.sender, in.target, "fetching tensors: "+err.Error())
	} else if proc, ok := n.system.ProcessRegistry.GetLocal(in.target.Id); ok {
		n.deliver(proc, in)
	} else {
		in.sess.freeTensors()
		n.replyDeadLetter(ps, in.sender, in.target, "actor stopped before delivery")
	}
	ps.queued.Add(-1)
}

// abortInbox releases the leases and tensors of the messages still in ps's
// inbox, and of any the reader queues later.
func (n *Node) abortInbox(ps *peerState) {
	for _, in := range ps.closeInbox() {
		in.sess.abort(n.ctx)
		ps.queued.Add(-1)
	}
}
