package verbs

import (
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

// acquisition is one read of an export by the peer, between begin and end.
type acquisition struct {
	reg  *ownerReg
	done func()
}

// ownerPeer is what the owner holds for one fetching peer: a protection
// domain (so its rkeys work through this peer's queue pair only), the queue
// pair the peer connected to, the regions registered for it and its reads
// in progress.
type ownerPeer struct {
	c    *Channel
	node string

	mu       sync.Mutex
	closed   bool
	pd       *ibverbs.PD
	cq       *ibverbs.CQ
	qp       *ibverbs.QP
	regs     map[regKey]*ownerReg
	byExport map[uint64]*ownerReg
	acq      map[uint64]*acquisition
	token    uint64
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

// offer registers an export for the peer.
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
		// The peer reconnects after an error: its old queue pair is gone.
		if err := op.qp.Close(); err != nil {
			op.c.log.Warn("destroying an old queue pair", zap.String("peer", op.node), zap.Error(err))
		}
		op.qp = nil
	}
	if op.cq == nil {
		// A responder to READs completes nothing; the CQ is only required.
		if op.cq, err = op.c.ctx.CreateCQ(4); err != nil {
			return err
		}
	}
	qp, err := op.pd.CreateRCQP(op.cq, ibverbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1})
	if err != nil {
		return err
	}
	psn := randomPSN()
	if err := qp.Connect(op.c.port, ibverbs.AccessRemoteRead, remote, psn, op.c.cfg.Connect); err != nil {
		_ = qp.Close()
		return err
	}
	op.qp = qp
	rep.Endpoint = endpointToMsg(qp.LocalEndpoint(op.c.port, psn))
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
	if op.qp != nil {
		warn("destroying a queue pair", op.qp.Close())
	}
	for t, a := range op.acq {
		delete(op.acq, t)
		a.done()
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
