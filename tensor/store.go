package tensor

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Store lookups. Each fails one transfer, never the
// connection it came on.
var (
	ErrUnknownExport = errors.New("tensor: unknown export id")
	ErrBadLease      = errors.New("tensor: lease was not issued for this export")
	ErrStale         = errors.New("tensor: descriptor from another incarnation of the owner")
	ErrStoreClosed   = errors.New("tensor: store closed")
)

// Export is one tensor lent out by its owner under one lease.
type Export struct {
	ID       uint64
	Lease    uint64
	Tensor   *Tensor
	Holder   string    // node the lease was issued to
	Deadline time.Time // zero: no deadline

	timer *time.Timer
	uses  int  // acquisitions in progress
	ended bool // removed from the table; the tensor's lease is dropped when uses reaches 0

	checked bool      // exported under a lend check: sum holds the tensor's checksum
	sum     uint32    // memory.Checksum of the tensor at export
	lentAt  time.Time // when a checked export began
}

// Store is an owner's table of exported tensors with their leases. It is
// safe for concurrent use. Data channels serve only ids found here and check
// every request against the export's bounds.
type Store struct {
	node        string
	incarnation uint64

	mu      sync.Mutex
	nextID  uint64
	exports map[uint64]*Export
	closed  bool
	onEnd   map[uint64]func(*Export)
	nextSub uint64

	lendCheck  func(LendViolation) // nil: off
	violations atomic.Uint64
}

// NewStore returns an empty store for the named node's incarnation.
func NewStore(node string, incarnation uint64) *Store {
	return &Store{node: node, incarnation: incarnation, exports: map[uint64]*Export{}}
}

// Node returns the owner node's name.
func (s *Store) Node() string { return s.node }

// Incarnation returns the owner node's incarnation.
func (s *Store) Incarnation() uint64 { return s.incarnation }

// OnEnd adds a function called (outside the store's lock) whenever an export
// ends: released, expired, dropped with its holder, or at Close. Channels use
// it to drop per-export state (for example an RDMA key). The returned
// function removes it.
func (s *Store) OnEnd(f func(*Export)) (cancel func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onEnd == nil {
		s.onEnd = map[uint64]func(*Export){}
	}
	s.nextSub++
	id := s.nextSub
	s.onEnd[id] = f
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.onEnd, id)
	}
}

func randomLease() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("tensor: crypto/rand failed: " + err.Error())
		}
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// Export lends t to holder: it takes a lease on t that ends on Release, when
// ttl passes (ttl <= 0: no deadline), or when ReleaseHolder(holder) is
// called. The returned descriptor has no offers; the data channels add them.
//
// Export fails with ErrStoreClosed after Close, and with an error wrapping
// ErrWriting while a Write on t is in progress: it does not wait, so a Write
// callback that sends its own tensor fails instead of deadlocking. Under a
// lend check (SetLendCheck) Export first reads the whole tensor to checksum
// it, and fails if that read fails.
func (s *Store) Export(t *Tensor, holder string, ttl time.Duration) (*Export, *Descriptor, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, ErrStoreClosed
	}
	if err := t.addLease(); err != nil { // before the timer can end it
		s.mu.Unlock()
		return nil, nil, err
	}
	e := &Export{Tensor: t, Holder: holder}
	if s.lendCheck != nil {
		// Checksum outside the lock: it reads the whole tensor.
		s.mu.Unlock()
		sum, err := lendChecksum(t)
		s.mu.Lock()
		if err == nil && s.closed {
			err = ErrStoreClosed
		}
		if err != nil {
			s.mu.Unlock()
			t.dropLease()
			return nil, nil, err
		}
		e.checked, e.sum, e.lentAt = true, sum, time.Now()
	}
	s.nextID++
	e.ID, e.Lease = s.nextID, randomLease()
	if ttl > 0 {
		e.Deadline = time.Now().Add(ttl)
		id, lease := e.ID, e.Lease
		e.timer = time.AfterFunc(ttl, func() { _ = s.Release(id, lease) })
	}
	s.exports[e.ID] = e
	s.mu.Unlock()
	d := &Descriptor{
		Owner:       s.node,
		Incarnation: s.incarnation,
		ExportID:    e.ID,
		Lease:       e.Lease,
		DType:       t.DType(),
		Shape:       t.Shape().Clone(),
		Bytes:       t.ByteSize(),
		Device:      t.Device().String(),
		Holder:      holder,
		Content:     t.lentContent(),
	}
	return e, d, nil
}

func (s *Store) find(incarnation, id, lease uint64) (*Export, error) {
	if incarnation != s.incarnation {
		return nil, fmt.Errorf("%w: %s incarnation %d, descriptor says %d", ErrStale, s.node, s.incarnation, incarnation)
	}
	e, ok := s.exports[id]
	if !ok {
		return nil, fmt.Errorf("%w: %d on %s (never issued, released or expired)", ErrUnknownExport, id, s.node)
	}
	if e.Lease != lease {
		return nil, fmt.Errorf("%w: export %d", ErrBadLease, id)
	}
	return e, nil
}

// Acquire looks up an export for serving a fetch and keeps its tensor lent
// until done is called, even if the lease ends meanwhile.
func (s *Store) Acquire(incarnation, id, lease uint64) (e *Export, done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrStoreClosed
	}
	e, err = s.find(incarnation, id, lease)
	if err != nil {
		return nil, nil, err
	}
	e.uses++
	var once sync.Once
	return e, func() { once.Do(func() { s.unuse(e) }) }, nil
}

func (s *Store) unuse(e *Export) {
	s.mu.Lock()
	e.uses--
	last := e.ended && e.uses == 0
	s.mu.Unlock()
	if last {
		s.drop(e)
	}
}

// Release ends a lease. Releasing an unknown or already released lease
// returns ErrUnknownExport or ErrBadLease.
func (s *Store) Release(id, lease uint64) error {
	s.mu.Lock()
	e, err := s.find(s.incarnation, id, lease)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	drop := s.end(e)
	f := s.endHooks()
	s.mu.Unlock()
	s.finish(e, drop, f)
	return nil
}

// end removes e from the table and reports whether its lease must be
// dropped now (no acquisition in progress; otherwise the last one drops
// it). s.mu must be held: deciding under the same lock as unuse means the
// lease is dropped exactly once.
func (s *Store) end(e *Export) (drop bool) {
	delete(s.exports, e.ID)
	e.ended = true
	if e.timer != nil {
		e.timer.Stop()
	}
	return e.uses == 0
}

// endHooks returns one function calling every OnEnd subscriber, or nil;
// s.mu must be held.
func (s *Store) endHooks() func(*Export) {
	if len(s.onEnd) == 0 {
		return nil
	}
	fs := make([]func(*Export), 0, len(s.onEnd))
	for _, f := range s.onEnd {
		fs = append(fs, f)
	}
	return func(e *Export) {
		for _, f := range fs {
			f(e)
		}
	}
}

// finish completes an ended export outside the store's lock.
// finish runs the OnEnd subscribers, then drops the lease: by the time
// the owner sees its tensor released (WaitReleased), every channel has
// dropped what it kept for the export (an RDMA key, a registration).
func (s *Store) finish(e *Export, drop bool, onEnd func(*Export)) {
	if onEnd != nil {
		onEnd(e)
	}
	if drop {
		s.drop(e)
	}
}

// drop ends e's lease on its tensor, outside the store's lock. An export
// made under a lend check is checked first, while the tensor is still lent.
func (s *Store) drop(e *Export) {
	if e.checked {
		s.checkLend(e)
	}
	e.Tensor.dropLease()
}

// ReleaseHolder ends every lease issued to holder (its node went down) and
// returns how many ended.
func (s *Store) ReleaseHolder(holder string) int {
	s.mu.Lock()
	var ended []*Export
	var drops []bool
	for _, e := range s.exports {
		if e.Holder == holder {
			drops = append(drops, s.end(e))
			ended = append(ended, e)
		}
	}
	f := s.endHooks()
	s.mu.Unlock()
	for i, e := range ended {
		s.finish(e, drops[i], f)
	}
	return len(ended)
}

// Len returns the number of live exports.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.exports)
}

// Close ends every lease and refuses new exports.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	var ended []*Export
	var drops []bool
	for _, e := range s.exports {
		drops = append(drops, s.end(e))
		ended = append(ended, e)
	}
	f := s.endHooks()
	s.mu.Unlock()
	for i, e := range ended {
		s.finish(e, drops[i], f)
	}
}

// Lent returns the number of live exports and their bytes.
func (s *Store) Lent() (n int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.exports {
		bytes += e.Tensor.ByteSize()
	}
	return len(s.exports), bytes
}
