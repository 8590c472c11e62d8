package tensor

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

// LendViolation reports an export whose tensor changed while it was lent:
// its owner wrote it before the lease ended, so the holder may have fetched
// a mix of old and new bytes. See Store.SetLendCheck.
type LendViolation struct {
	ExportID uint64
	Holder   string // node the tensor was lent to
	Tensor   *Tensor
	Lent     time.Time // when the export began
	Ended    time.Time // when the lease ended (release, ttl, holder down, Close)
	// LentSum and EndSum are the CRC-32C of the tensor's bytes at export
	// and at the end of the lease (memory.Checksum).
	LentSum, EndSum uint32
	// Err is non-nil when the checksum at the end could not be computed
	// (a failed device copy): the tensor may or may not have changed, and
	// the report is not counted in LendViolations.
	Err error
}

// String describes the violation for a log line, e.g. "tensor:
// float32[4]@cpu written while lent (export 7 to node b for 1.5ms):
// checksum 0x1f2e3d4c at export, 0x5a6b7c8d at release".
func (v LendViolation) String() string {
	if v.Err != nil {
		return fmt.Sprintf("tensor: %v lent (export %d to node %s for %v): not checked at release: %v",
			v.Tensor, v.ExportID, v.Holder, v.Ended.Sub(v.Lent), v.Err)
	}
	return fmt.Sprintf("tensor: %v written while lent (export %d to node %s for %v): checksum %#08x at export, %#08x at release",
		v.Tensor, v.ExportID, v.Holder, v.Ended.Sub(v.Lent), v.LentSum, v.EndSum)
}

// SetLendCheck turns on the lend check, a debugging aid that catches owners
// writing a tensor they have lent: every Export checksums the tensor's
// bytes, and the end of its lease (release, ttl, ReleaseHolder, Close,
// after the last acquisition) checksums them again. A mismatch increments
// LendViolations and calls f with the export. f is called outside the
// store's lock, on the goroutine that ended the lease, before the owner
// sees the tensor released; it must not block.
//
// Each export is checked on its own, so overlapping exports of one tensor
// are each reported. The check costs two full reads of the tensor per send
// (a device tensor is copied to host memory in 8 MiB chunks), so it is off
// by default. f == nil turns it off: exports made meanwhile are no longer
// checked at their end.
func (s *Store) SetLendCheck(f func(v LendViolation)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lendCheck = f
}

// LendViolations returns how many exports the lend check found written
// while lent since the store was made.
func (s *Store) LendViolations() uint64 { return s.violations.Load() }

// lendChecksum checksums t's bytes for the lend check.
func lendChecksum(t *Tensor) (uint32, error) {
	sum, err := memory.Checksum(context.Background(), t.buf)
	if err != nil {
		return 0, fmt.Errorf("tensor: lend check of %v: %w", t, err)
	}
	return sum, nil
}

// checkLend compares a checked export's tensor with its checksum at export
// and reports a change. It runs before the lease is dropped.
func (s *Store) checkLend(e *Export) {
	s.mu.Lock()
	report := s.lendCheck
	s.mu.Unlock()
	if report == nil {
		return
	}
	sum, err := lendChecksum(e.Tensor)
	if err == nil && sum == e.sum {
		return
	}
	v := LendViolation{ExportID: e.ID, Holder: e.Holder, Tensor: e.Tensor, Lent: e.lentAt, Ended: time.Now(),
		LentSum: e.sum, EndSum: sum, Err: err}
	if err == nil {
		s.violations.Add(1)
	}
	report(v)
}
