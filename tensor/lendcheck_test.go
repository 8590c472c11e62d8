package tensor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

// lendReports records the lend check's reports, and whether the tensor was
// still lent when each came.
type lendReports struct {
	mu   sync.Mutex
	got  []LendViolation
	lent []bool
	c    chan struct{}
}

func checkLends(s *Store) *lendReports {
	r := &lendReports{c: make(chan struct{}, 100)}
	s.SetLendCheck(func(v LendViolation) {
		r.mu.Lock()
		r.got = append(r.got, v)
		r.lent = append(r.lent, v.Tensor.Leases() > 0)
		r.mu.Unlock()
		r.c <- struct{}{}
	})
	return r
}

func (r *lendReports) all() ([]LendViolation, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]LendViolation(nil), r.got...), append([]bool(nil), r.lent...)
}

// A write through the raw slice while lent is reported, with the export,
// whichever way the lease ends; an untouched tensor is not.
func TestLendCheck(t *testing.T) {
	ends := []struct {
		name string
		end  func(s *Store, e *Export)
	}{
		{"release", func(s *Store, e *Export) { _ = s.Release(e.ID, e.Lease) }},
		{"holder down", func(s *Store, e *Export) { s.ReleaseHolder(e.Holder) }},
		{"close", func(s *Store, e *Export) { s.Close() }},
		{"acquisition after release", func(s *Store, e *Export) {
			_, done, err := s.Acquire(1, e.ID, e.Lease)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Release(e.ID, e.Lease)
			e.Tensor.Host()[1] ^= 0x80 // still lent: the fetch is in progress
			done()
		}},
	}
	for _, tc := range ends {
		for _, write := range []bool{false, true} {
			s := NewStore("a", 1)
			r := checkLends(s)
			x := hostTensor(t, 64)
			e, _, err := s.Export(x, "b", 0)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				x.Host()[7] = 1
			}
			tc.end(s, e)
			got, lent := r.all()
			want := 0
			if write || tc.name == "acquisition after release" {
				want = 1
			}
			if len(got) != want || s.LendViolations() != uint64(want) {
				t.Fatalf("%s, written %v: %d reports, %d counted, want %d", tc.name, write, len(got), s.LendViolations(), want)
			}
			if want == 1 {
				v := got[0]
				if v.ExportID != e.ID || v.Holder != "b" || v.Tensor != x || v.LentSum == v.EndSum || v.Err != nil ||
					v.Lent.IsZero() || v.Ended.Before(v.Lent) || !lent[0] {
					t.Errorf("%s: report %+v (tensor still lent: %v)", tc.name, v, lent[0])
				}
				if s := v.String(); !strings.HasPrefix(s, "tensor: uint8[64]@cpu written while lent (export 1 to node b for ") {
					t.Errorf("%s: String() = %q", tc.name, s)
				}
			}
			if x.Leases() != 0 {
				t.Fatalf("%s: %d leases left", tc.name, x.Leases())
			}
			s.Close()
		}
	}
}

// The ttl ends a lease while a fetch holds the tensor; a write during the
// fetch is reported when the fetch ends.
func TestLendCheckTTL(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	r := checkLends(s)
	ended := make(chan uint64, 1)
	s.OnEnd(func(e *Export) { ended <- e.ID })
	x := hostTensor(t, 64)
	var e *Export
	var done func()
	for done == nil { // until the acquisition beats the ttl
		e, _, _ = s.Export(x, "b", time.Millisecond)
		_, done, _ = s.Acquire(1, e.ID, e.Lease)
		if done == nil {
			<-ended
		}
	}
	x.Host()[0] = 1
	if id := <-ended; id != e.ID {
		t.Fatalf("export %d ended, want %d", id, e.ID)
	}
	if got, _ := r.all(); len(got) != 0 {
		t.Fatal("reported before the fetch ended")
	}
	done()
	got, lent := r.all()
	if len(got) != 1 || got[0].ExportID != e.ID || !lent[0] || s.LendViolations() != 1 {
		t.Fatalf("reports %+v, %d counted", got, s.LendViolations())
	}
	<-x.Released()
}

// Each overlapping export is checked on its own window.
func TestLendCheckOverlapping(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	r := checkLends(s)
	x := hostTensor(t, 64)
	e1, _, _ := s.Export(x, "b", 0)
	x.Host()[3] = 9 // during e1 only
	e2, _, _ := s.Export(x, "c", 0)
	_ = s.Release(e2.ID, e2.Lease)
	if got, _ := r.all(); len(got) != 0 {
		t.Fatalf("export %d, lent after the write, was reported", got[0].ExportID)
	}
	_ = s.Release(e1.ID, e1.Lease)
	if got, _ := r.all(); len(got) != 1 || got[0].ExportID != e1.ID || got[0].Holder != "b" {
		t.Fatalf("reports %+v, want export %d", got, e1.ID)
	}
}

func TestLendCheckOff(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	r := checkLends(s)
	x := hostTensor(t, 64)
	e1, _, _ := s.Export(x, "b", 0)
	s.SetLendCheck(nil)
	e2, _, _ := s.Export(x, "b", 0)
	x.Host()[0] = 1
	_ = s.Release(e1.ID, e1.Lease)
	_ = s.Release(e2.ID, e2.Lease)
	if got, _ := r.all(); len(got) != 0 || s.LendViolations() != 0 {
		t.Fatalf("with the check off: %d reports, %d counted", len(got), s.LendViolations())
	}
}

// The same check on a CUDA tensor: the checksum copies device memory to the
// host (in chunks: the tensor is larger than one), and a write into device
// memory during the lease is reported.
func TestLendCheckCUDA(t *testing.T) {
	const n = 3 << 20 // 12 MiB of float32
	x, err := New(memory.CUDA(0), Float32, Shape{n})
	if errors.Is(err, memory.ErrNotSupported) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	ctx := context.Background()
	host, _ := New(memory.CPU, Float32, Shape{n})
	if err := memory.Copy(ctx, x.Buffer(), host.Buffer()); err != nil {
		t.Fatal(err)
	}
	s := NewStore("a", 1)
	defer s.Close()
	r := checkLends(s)

	e, _, err := s.Export(x, "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Release(e.ID, e.Lease)
	if got, _ := r.all(); len(got) != 0 {
		t.Fatalf("untouched device tensor reported: %v", got[0])
	}

	e, _, _ = s.Export(x, "b", 0)
	last, _ := x.Buffer().Slice(x.Buffer().Len()-4, 4)
	if err := memory.Copy(ctx, last, memory.WrapHost([]byte{0, 0, 0x80, 0x3f})); err != nil { // 1.0
		t.Fatal(err)
	}
	_ = s.Release(e.ID, e.Lease)
	got, lent := r.all()
	if len(got) != 1 || got[0].ExportID != e.ID || got[0].Tensor != x || got[0].Err != nil || !lent[0] ||
		s.LendViolations() != 1 {
		t.Fatalf("reports %+v, %d counted", got, s.LendViolations())
	}
	if !strings.HasPrefix(got[0].String(), "tensor: float32[3145728]@cuda:0 written while lent") {
		t.Errorf("String() = %q", got[0].String())
	}
	// Write is the checked path for device tensors too.
	if err := x.Write(func(buf memory.Buffer) error { return memory.Copy(ctx, buf, host.Buffer()) }); err != nil {
		t.Fatal(err)
	}
}
