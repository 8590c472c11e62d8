package ipc

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// exportedHandle is the IPC handle of one driver allocation, made once and
// cached until the allocation is freed.
type exportedHandle struct {
	h      memory.IPCHandle
	shift  uint64  // Allocation.Base - driver allocation base
	base   uintptr // driver allocation base
	device int
}

// Offer describes where e's tensor lies in its CUDA allocation. It returns
// nil for tensors that are not in CUDA memory. The offer grants nothing:
// the IPC handle is given later, in the answer to the fetcher's begin
// request, only to the export's holder and only once that node has proven
// it runs on this host (see the package documentation). When the holder
// already got this allocation's handle, the offer is direct: the holder may
// copy under the lease alone, before its deadline, without begin and end.
func (c *Channel) Offer(_ context.Context, e *tensor.Export, peer string) ([]byte, error) {
	buf := e.Tensor.Buffer()
	if buf.Device().Kind != memory.KindCUDA {
		return nil, nil
	}
	o, err := offerOf(buf)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, rdma.ErrClosed
	}
	if peer == e.Holder && !c.cfg.NoDirect && c.proven[peer] && c.grants[peer][o.Alloc] {
		if deadline, ok := monoDeadline(e.Deadline); ok {
			o.Flags |= flagDirect
			o.Deadline = deadline
			c.ownerStats.directOffers++
		}
	}
	return o.encode(), nil
}

// monoDeadline converts a lease deadline (zero: none) to the host's
// CLOCK_MONOTONIC, minus a millisecond for the time between the two clock
// readings. It reports false when the deadline has passed or the platform
// has no such clock.
func monoDeadline(deadline time.Time) (uint64, bool) {
	now, ok := monoNow()
	if !ok {
		return 0, false
	}
	if deadline.IsZero() {
		return 0, true
	}
	left := time.Until(deadline) - time.Millisecond
	if left <= 0 {
		return 0, false
	}
	return now + uint64(left), true
}

// offerOf locates buf inside its allocation.
func offerOf(buf memory.Buffer) (offer, error) {
	a := buf.Allocation()
	p := buf.Ptr()
	if buf.Len() > 0 && (p < a.Base || uint64(p-a.Base) > uint64(a.Size) || uint64(buf.Len()) > uint64(a.Size)-uint64(p-a.Base)) {
		return offer{}, fmt.Errorf("ipc: buffer %#x+%d outside its allocation %#x+%d", p, buf.Len(), a.Base, a.Size)
	}
	var off uint64
	if p >= a.Base {
		off = uint64(p - a.Base)
	}
	return offer{Alloc: a.ID, Offset: off, Bytes: uint64(buf.Len()), AllocSize: uint64(a.Size)}, nil
}

// allocationFreed is the memory.OnFree hook: it drops the cached handle and
// tells every peer that got it to close its mapping (a revoke request sent
// in the background, and the next begin reply).
func (c *Channel) allocationFreed(a memory.Allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.handles[a.ID]; !ok {
		return
	}
	delete(c.handles, a.ID)
	queued := false
	for peer, g := range c.grants {
		if g[a.ID] {
			delete(g, a.ID)
			c.revoked[peer] = append(c.revoked[peer], a.ID)
			queued = true
		}
	}
	if queued && !c.pushing && !c.closed {
		c.pushing = true
		c.bg.Add(1)
		go c.pushRevocations()
	}
}

// pushRevocations sends every peer its list of revoked allocations until no
// list is left. A list that cannot be delivered stays queued for the peer's
// next begin reply; a peer that went down dropped its mappings already.
func (c *Channel) pushRevocations() {
	defer c.bg.Done()
	inc := c.env.Store.Incarnation()
	failed := map[string]bool{}
	for {
		c.mu.Lock()
		var peer string
		var ids []uint64
		for p, r := range c.revoked {
			if failed[p] {
				continue
			}
			peer, ids = p, r[:min(len(r), maxRevoked)]
			if len(ids) == len(r) {
				delete(c.revoked, p)
			} else {
				c.revoked[p] = r[len(ids):]
			}
			break
		}
		if ids == nil || c.closed {
			c.pushing = false
			c.mu.Unlock()
			return
		}
		c.ownerStats.revokesSent++
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
		_, err := c.call(ctx, peer, &request{Op: opRevoke, Incarnation: inc, Revoked: ids})
		cancel()
		if err != nil {
			c.log.Debug("ipc: revoke not delivered; kept for the peer's next begin", zap.String("peer", peer), zap.Error(err))
			failed[peer] = true
			c.mu.Lock()
			if c.grants[peer] != nil { // still known: not down
				c.revoked[peer] = append(append([]uint64(nil), ids...), c.revoked[peer]...)
			}
			c.mu.Unlock()
		}
	}
}

// handleRevoke closes the mappings of allocations their owner freed.
func (c *Channel) handleRevoke(owner string, req *request) *reply {
	c.fmu.Lock()
	c.fetchStats.revokes++
	c.fmu.Unlock()
	c.revoke(owner, req.Incarnation, req.Revoked)
	return &reply{Code: rdma.CodeOK}
}

func (c *Channel) handleChallenge(peer string) *reply {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errorReply(rdma.ErrClosed)
	}
	old := c.challenges[peer]
	delete(c.challenges, peer)
	expired := c.sweepChallengesLocked(time.Now())
	c.mu.Unlock()
	if old != nil {
		old.remove()
	}
	for _, ch := range expired {
		ch.remove()
	}
	ch, err := newChallenge(c.cfg.ShmDir, c.cfg.ChallengeTTL)
	if err != nil {
		return errorReply(err)
	}
	c.mu.Lock()
	if c.closed || c.challenges[peer] != nil {
		// Closed, or a concurrent challenge for the same peer won.
		c.mu.Unlock()
		ch.remove()
		return errorReply(fmt.Errorf("ipc: challenge for %s superseded or channel closed", peer))
	}
	c.challenges[peer] = ch
	c.mu.Unlock()
	return &reply{Code: rdma.CodeOK, Challenge: ch.id, Path: ch.path}
}

// sweepChallengesLocked removes expired challenges and returns them, for
// their files to be deleted outside the lock.
func (c *Channel) sweepChallengesLocked(now time.Time) []*challenge {
	var out []*challenge
	for peer, ch := range c.challenges {
		if now.After(ch.expires) {
			out = append(out, ch)
			delete(c.challenges, peer)
		}
	}
	return out
}

func (c *Channel) handleProve(peer string, req *request) *reply {
	c.mu.Lock()
	ch := c.challenges[peer]
	if ch == nil || ch.id != req.Challenge {
		c.mu.Unlock()
		return errorReply(fmt.Errorf("%w: no pending challenge %d for %s", ErrUnproven, req.Challenge, peer))
	}
	delete(c.challenges, peer)
	err := ch.verify(peer, req.MAC, time.Now())
	if err == nil && !c.closed {
		c.proven[peer] = true
	}
	c.mu.Unlock()
	ch.remove()
	if err != nil {
		c.log.Warn("same-host proof failed", zap.String("peer", peer), zap.Error(err))
		return errorReply(err)
	}
	return &reply{Code: rdma.CodeOK}
}

// handleBegin acquires an export for one copy by peer.
func (c *Channel) handleBegin(peer string, req *request) *reply {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errorReply(rdma.ErrClosed)
	}
	if c.acqs[peer][req.Acq] != nil {
		c.mu.Unlock()
		return errorReply(fmt.Errorf("%w: acquisition %d already in use", errBadMessage, req.Acq))
	}
	if len(c.acqs[peer]) >= c.cfg.MaxAcquisitions {
		c.mu.Unlock()
		return errorReply(fmt.Errorf("%w: %d", errBusy, c.cfg.MaxAcquisitions))
	}
	proven := c.proven[peer]
	c.mu.Unlock()

	e, done, err := c.env.Store.Acquire(req.Incarnation, req.ExportID, req.Lease)
	if err != nil {
		return errorReply(err)
	}
	rep, err := c.checkBegin(peer, req, e, proven)
	if err != nil {
		done()
		return errorReply(err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		done()
		return errorReply(rdma.ErrClosed)
	}
	if c.acqs[peer] == nil {
		c.acqs[peer] = map[uint64]func(){}
	}
	if c.acqs[peer][req.Acq] != nil {
		c.mu.Unlock()
		done()
		return errorReply(fmt.Errorf("%w: acquisition %d already in use", errBadMessage, req.Acq))
	}
	c.acqs[peer][req.Acq] = done
	c.nAcqs++
	if rep.Handle != nil {
		if c.grants[peer] == nil {
			c.grants[peer] = map[uint64]bool{}
		}
		c.grants[peer][req.Alloc] = true
	}
	if r := c.revoked[peer]; len(r) > 0 {
		n := min(len(r), maxRevoked)
		rep.Revoked = append([]uint64(nil), r[:n]...)
		c.revoked[peer] = r[n:]
		if len(c.revoked[peer]) == 0 {
			delete(c.revoked, peer)
		}
	}
	c.mu.Unlock()
	return rep
}

// checkBegin checks that peer may copy e as the request says, and makes
// the IPC handle when asked.
func (c *Channel) checkBegin(peer string, req *request, e *tensor.Export, proven bool) (*reply, error) {
	if e.Holder != peer {
		return nil, fmt.Errorf("ipc: export %d was lent to %s, not %s: %w", e.ID, e.Holder, peer, tensor.ErrBadLease)
	}
	buf := e.Tensor.Buffer()
	if buf.Device().Kind != memory.KindCUDA {
		return nil, fmt.Errorf("%w: export %d is in %s memory", errBadMessage, e.ID, buf.Device())
	}
	o, err := offerOf(buf)
	if err != nil {
		return nil, err
	}
	if o.Alloc != req.Alloc || o.Offset != req.Offset || o.Bytes != req.Bytes {
		return nil, fmt.Errorf("%w: request (allocation %d, [%d, +%d)) does not match export %d (allocation %d, [%d, +%d))",
			errBadMessage, req.Alloc, req.Offset, req.Bytes, e.ID, o.Alloc, o.Offset, o.Bytes)
	}
	rep := &reply{Code: rdma.CodeOK}
	if !req.WantHandle || o.Bytes == 0 {
		return rep, nil
	}
	if !proven {
		return nil, fmt.Errorf("%w: %s", ErrUnproven, peer)
	}
	h, err := c.handleFor(buf)
	if err != nil {
		return nil, err
	}
	rep.Handle = append([]byte(nil), h.h.Handle[:]...)
	rep.MapSize = uint64(h.h.Size)
	rep.Shift = h.shift
	rep.Base = uint64(h.base)
	rep.Device = h.device
	rep.Process = append([]byte(nil), processID[:]...)
	return rep, nil
}

// handleFor returns the cached IPC handle of buf's allocation, making it on
// first use (one cuIpcGetMemHandle per allocation).
func (c *Channel) handleFor(buf memory.Buffer) (*exportedHandle, error) {
	a := buf.Allocation()
	c.mu.Lock()
	h := c.handles[a.ID]
	c.mu.Unlock()
	if h != nil {
		return h, nil
	}
	raw, off, err := c.exportIPC(buf)
	if err != nil {
		return nil, fmt.Errorf("ipc: export of allocation %d: %w", a.ID, err)
	}
	base := buf.Ptr() - uintptr(off)
	if a.Base < base || uint64(a.Base-base)+uint64(a.Size) > uint64(raw.Size) {
		return nil, fmt.Errorf("ipc: allocation %#x+%d is not inside the driver allocation %#x+%d", a.Base, a.Size, base, raw.Size)
	}
	h = &exportedHandle{h: raw, shift: uint64(a.Base - base), base: base, device: buf.Device().Index}
	c.mu.Lock()
	c.ownerStats.handleExports++
	if old := c.handles[a.ID]; old != nil {
		h = old
	} else if !c.closed {
		c.handles[a.ID] = h
	}
	c.mu.Unlock()
	return h, nil
}

func (c *Channel) handleEnd(peer string, req *request) *reply {
	c.mu.Lock()
	done := c.acqs[peer][req.Acq]
	if done != nil {
		delete(c.acqs[peer], req.Acq)
		if len(c.acqs[peer]) == 0 {
			delete(c.acqs, peer)
		}
		c.nAcqs--
	}
	c.mu.Unlock()
	if done == nil {
		// Already ended (peer down, channel closed) or never begun (the
		// begin failed or was lost): nothing is held.
		return &reply{Code: rdma.CodeOK}
	}
	done()
	return &reply{Code: rdma.CodeOK}
}

// takeAcquisitionsLocked removes peer's acquisitions and returns their done
// functions, to be called outside the lock.
func (c *Channel) takeAcquisitionsLocked(peer string) []func() {
	var out []func()
	for _, done := range c.acqs[peer] {
		out = append(out, done)
	}
	c.nAcqs -= len(c.acqs[peer])
	delete(c.acqs, peer)
	return out
}
