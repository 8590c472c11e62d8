package verbs

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// maxReadsPerPeer bounds the reads one peer may have begun and not ended.
const maxReadsPerPeer = 4096

// regKey names a registered range of an allocation.
type regKey struct {
	alloc uint64
	addr  uintptr
	n     int
}

// ownerReg is an export's bytes registered for one peer with remote read
// access.
type ownerReg struct {
	key     regKey
	mr      *ibverbs.MR
	exports int  // live exports offered to the peer over this range
	active  int  // reads in progress (acquisitions)
	dead    bool // allocation freed: deregister when idle, offer no more
}

// acquisition is one read of an export by the peer, between begin and end:
// through a per-export registration (reg) or a window (grant).
type acquisition struct {
	reg   *ownerReg
	grant *grant
	done  func()
}

// ownerPeer is what the owner holds for one fetching peer: a protection
// domain (so its rkeys work through this peer's queue pair only), the queue
// pair the peer connected to, the regions registered for it (per export, or
// per allocation in the owner caches under key, with a window per export)
// and its reads in progress.
type ownerPeer struct {
	c    *Channel
	node string
	rail rail   // the device serving the peer's rail of the same index
	key  string // the owner caches' peer string for this peer's registrations

	mu       sync.Mutex
	closed   bool
	pd       *ibverbs.PD
	cq       *ibverbs.CQ
	qp       *ibverbs.QP
	regs     map[regKey]*ownerReg
	byExport map[uint64]*ownerReg
	acq      map[uint64]*acquisition
	token    uint64
	grants   map[uint64]*grant // by export ID (GrantWindows)
	freeMWs  []*ibverbs.MW     // invalidated windows, for reuse
	wrid     uint64
}

func (op *ownerPeer) acquired() int {
	op.mu.Lock()
	defer op.mu.Unlock()
	return len(op.acq)
}

// register returns the registration of buf's bytes, making it if needed.
// op.mu must be held.
func (op *ownerPeer) register(buf memory.Buffer) (*ownerReg, error) {
	key := regKey{alloc: buf.Allocation().ID, addr: buf.Ptr(), n: buf.Len()}
	if r := op.regs[key]; r != nil && !r.dead {
		op.c.stats.ownerHit.Add(1)
		return r, nil
	}
	mr, err := regBuffer(op.pd, buf, 0, buf.Len(), ibverbs.AccessRemoteRead)
	if err != nil {
		return nil, err
	}
	op.c.stats.ownerReg.Add(1)
	r := &ownerReg{key: key, mr: mr}
	op.regs[key] = r
	return r, nil
}

// offer registers an export for the peer (GrantRegister).
func (op *ownerPeer) offer(id uint64, buf memory.Buffer) (*ownerReg, error) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed {
		return nil, rdma.ErrClosed
	}
	if r := op.byExport[id]; r != nil {
		op.c.stats.ownerHit.Add(1)
		return r, nil
	}
	r, err := op.register(buf)
	if err != nil {
		return nil, err
	}
	r.exports++
	op.byExport[id] = r
	return r, nil
}

// maybeDereg deregisters r once no live export or read uses it. op.mu must
// be held.
func (op *ownerPeer) maybeDereg(r *ownerReg) {
	if r.exports > 0 && !r.dead || r.active > 0 {
		return
	}
	if op.regs[r.key] == r {
		delete(op.regs, r.key)
	}
	for id, x := range op.byExport {
		if x == r {
			delete(op.byExport, id)
		}
	}
	if err := r.mr.Close(); err != nil {
		op.c.log.Warn("deregistering an export", zap.String("peer", op.node), zap.Error(err))
	}
	op.c.stats.ownerDereg.Add(1)
}

func (op *ownerPeer) exportEnded(id uint64) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if g := op.grants[id]; g != nil {
		g.ended = true
		if g.active == 0 {
			op.revoke(g)
		}
		return
	}
	r := op.byExport[id]
	if r == nil {
		return
	}
	delete(op.byExport, id)
	r.exports--
	op.maybeDereg(r)
}

func (op *ownerPeer) allocationFreed(alloc uint64) {
	op.mu.Lock()
	defer op.mu.Unlock()
	for k, r := range op.regs {
		if k.alloc == alloc {
			r.dead = true
			op.maybeDereg(r)
		}
	}
}

// connect (re)creates the queue pair for the peer and connects it to the
// peer's endpoint.
func (op *ownerPeer) connect(m endpointMsg, rep *reply) error {
	remote, err := m.endpoint()
	if err != nil {
		return err
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed {
		return rdma.ErrClosed
	}
	if op.qp != nil {
		// The peer reconnects after an error: its old queue pair is gone,
		// and the windows bound through it with it.
		op.dropWindows()
		if err := op.qp.Close(); err != nil {
			op.c.log.Warn("destroying an old queue pair", zap.String("peer", op.node), zap.Error(err))
		}
		op.qp = nil
	}
	if op.cq == nil {
		// A responder to READs completes nothing; the CQ gets the completions of
		// binds and invalidations of windows, awaited one at a time.
		if op.cq, err = op.rail.ctx.CreateCQ(16); err != nil {
			return err
		}
	}
	qp, err := op.pd.CreateRCQP(op.cq, ibverbs.QPCaps{MaxSendWR: 8, MaxRecvWR: 1})
	if err != nil {
		return err
	}
	psn := randomPSN()
	if err := qp.Connect(op.rail.port, ibverbs.AccessRemoteRead, remote, psn, op.c.cfg.Connect); err != nil {
		_ = qp.Close()
		return err
	}
	op.qp = qp
	rep.Endpoint = endpointToMsg(qp.LocalEndpoint(op.rail.port, psn))
	return nil
}

// begin starts a read of an export by the peer: the lease must be valid and
// issued to this peer.
func (op *ownerPeer) begin(req *request, rep *reply) error {
	e, done, err := op.c.env.Store.Acquire(req.Incarnation, req.ExportID, req.Lease)
	if err != nil {
		return err
	}
	if e.Holder != op.node {
		done()
		return fmt.Errorf("verbs: export %d was lent to %s, not %s: %w", e.ID, e.Holder, op.node, tensor.ErrBadLease)
	}
	buf := e.Tensor.Buffer()
	if op.c.windowed(buf) {
		// Registered at Offer, unless it was not offered to this peer.
		if err := op.grantExport(e.ID, buf); err != nil {
			done()
			return err
		}
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed {
		done()
		return rdma.ErrClosed
	}
	if len(op.acq) >= maxReadsPerPeer {
		done()
		return fmt.Errorf("verbs: %s has %d reads in progress already", op.node, len(op.acq))
	}
	op.token++
	rep.Token = op.token
	rep.Len = int64(buf.Len())
	if buf.Len() == 0 {
		op.acq[op.token] = &acquisition{done: done}
		return nil
	}
	if g := op.grants[e.ID]; g != nil && !g.ended {
		err := op.bind(g)
		if err == nil {
			g.active++
			op.acq[op.token] = &acquisition{grant: g, done: done}
			rep.Addr = g.addr
			rep.RKey = g.rkey
			return nil
		}
		// A bind the provider refuses to post (one may not bind windows to
		// dmabuf regions): this kind of memory is registered per export
		// from now on, this export first. A bind that failed on the queue
		// pair (broken: the peer reconnects) fails this read only.
		var ce *ibverbs.CallError
		if !errors.As(err, &ce) || g.active > 0 {
			done()
			return err
		}
		op.c.refuseWindows(buf.Device(), err)
		op.revoke(g)
	}
	r := op.byExport[e.ID]
	if r == nil || r.dead {
		// Not offered to this peer (or freed and re-made): register now.
		if r, err = op.register(buf); err != nil {
			done()
			return err
		}
		r.exports++
		op.byExport[e.ID] = r
	}
	r.active++
	op.acq[op.token] = &acquisition{reg: r, done: done}
	rep.Addr = uint64(buf.Ptr())
	rep.RKey = r.mr.RKey()
	return nil
}

// end finishes a read started by begin.
func (op *ownerPeer) end(token uint64) error {
	op.mu.Lock()
	a := op.acq[token]
	delete(op.acq, token)
	if a != nil && a.reg != nil {
		a.reg.active--
		op.maybeDereg(a.reg)
	}
	if a != nil && a.grant != nil {
		a.grant.active--
		if a.grant.ended && a.grant.active == 0 {
			op.revoke(a.grant)
		}
	}
	op.mu.Unlock()
	if a == nil {
		return fmt.Errorf("%w: no read %d in progress", errBadMessage, token)
	}
	a.done()
	return nil
}

// close destroys the queue pair, ends the reads in progress and
// deregisters everything.
func (op *ownerPeer) close() {
	// No more registrations in the peer's protection domain (c.mu is taken
	// before op.mu elsewhere, so here before it too).
	op.c.mu.Lock()
	delete(op.c.destPDs, op.key)
	op.c.mu.Unlock()
	caches := op.c.ownerCaches()
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed {
		return
	}
	op.closed = true
	warn := func(what string, err error) {
		if err != nil {
			op.c.log.Warn(what, zap.String("peer", op.node), zap.Error(err))
		}
	}
	for t, a := range op.acq {
		delete(op.acq, t)
		a.done()
	}
	// Windows first (a region with windows bound cannot be deregistered),
	// then the cached registrations, before the protection domain.
	op.dropWindows()
	for id, g := range op.grants {
		delete(op.grants, id)
		g.put()
	}
	for _, mw := range op.freeMWs {
		op.closeMW(mw)
	}
	op.freeMWs = nil
	for _, rc := range caches {
		warn("dropping owner registrations", rc.DropPeer(op.key))
	}
	if op.qp != nil {
		warn("destroying a queue pair", op.qp.Close())
	}
	for k, r := range op.regs {
		delete(op.regs, k)
		warn("deregistering an export", r.mr.Close())
		op.c.stats.ownerDereg.Add(1)
	}
	op.byExport = map[uint64]*ownerReg{}
	if op.cq != nil {
		warn("destroying a completion queue", op.cq.Close())
	}
	warn("freeing a protection domain", op.pd.Close())
}
