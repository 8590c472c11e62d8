package tensor

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestReleased(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	x := hostTensor(t, 4)
	idle := x.Released()
	if !isClosed(idle) {
		t.Fatal("Released of a tensor never lent is open")
	}
	_, d1, _ := s.Export(x, "b", 0)
	_, d2, _ := s.Export(x, "c", 0)
	lent := x.Released()
	if isClosed(lent) || !isClosed(idle) {
		t.Fatal("while lent: the new channel is closed or the old one reopened")
	}
	if x.Released() != lent {
		t.Fatal("a second lease replaced the channel")
	}
	_ = s.Release(d1.ExportID, d1.Lease)
	if isClosed(lent) {
		t.Fatal("closed with a lease outstanding")
	}
	_ = s.Release(d2.ExportID, d2.Lease)
	if !isClosed(lent) || !isClosed(x.Released()) {
		t.Fatal("open after the last release")
	}
	_, _, _ = s.Export(x, "b", 0)
	if again := x.Released(); again == lent || isClosed(again) || !isClosed(lent) {
		t.Fatal("a lease after the release did not give a new, open channel")
	}
}

// An actor waits for Released in a select beside its other work.
func TestReleasedInSelect(t *testing.T) {
	s := NewStore("a", 1)
	x := hostTensor(t, 4)
	_, d, _ := s.Export(x, "b", time.Millisecond)
	select {
	case <-x.Released():
	case <-time.After(5 * time.Second):
		t.Fatalf("the ttl never ended the lease (%d out, export %d)", x.Leases(), d.ExportID)
	}
	if err := x.Write(func(memory.Buffer) error { return nil }); err != nil {
		t.Fatalf("Write after Released: %v", err)
	}
}

func TestWrite(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	x, _ := FromFloat32s([]float32{1, 2, 3, 4}, Shape{4})
	set := func(v float32) func(memory.Buffer) error {
		return func(buf memory.Buffer) error {
			if buf != x.Buffer() {
				t.Error("Write handed another buffer")
			}
			x.Float32s()[0] = v
			return nil
		}
	}
	if err := x.Write(set(5)); err != nil || x.Float32s()[0] != 5 {
		t.Fatalf("Write while idle: %v, x[0] = %v", err, x.Float32s()[0])
	}
	errF := errors.New("f failed")
	if err := x.Write(func(memory.Buffer) error { return errF }); err != errF {
		t.Fatalf("Write returned %v, want f's error", err)
	}

	_, d1, _ := s.Export(x, "b", 0)
	tests := []struct {
		leases int
		want   string
	}{
		{1, "tensor: write to float32[4]@cpu while lent (1 lease outstanding): wait for Released()"},
		{2, "tensor: write to float32[4]@cpu while lent (2 leases outstanding): wait for Released()"},
	}
	var d2 *Descriptor
	for _, tc := range tests {
		if tc.leases == 2 {
			_, d2, _ = s.Export(x, "c", 0)
		}
		err := x.Write(set(6))
		if !errors.Is(err, ErrLeased) || err.Error() != tc.want {
			t.Errorf("Write with %d leases: %v, want %q wrapping ErrLeased", tc.leases, err, tc.want)
		}
		if x.Float32s()[0] != 5 {
			t.Fatal("Write called f while lent")
		}
	}
	if err := x.Free(); !errors.Is(err, ErrLeased) ||
		err.Error() != "tensor: free float32[4]@cpu while lent (2 leases outstanding): wait for Released()" {
		t.Errorf("Free while lent: %v", err)
	}
	_ = s.Release(d1.ExportID, d1.Lease)
	_ = s.Release(d2.ExportID, d2.Lease)
	if err := x.Write(set(7)); err != nil || x.Float32s()[0] != 7 {
		t.Fatalf("Write after release: %v, x[0] = %v", err, x.Float32s()[0])
	}
}

// A Write holds off new leases: an Export during it fails at once with
// ErrWriting (no deadlock when f sends its own tensor), and a panicking f
// does not leave the tensor unlendable.
func TestExportDuringWrite(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	x := hostTensor(t, 4)
	err := x.Write(func(memory.Buffer) error {
		_, _, err := s.Export(x, "b", 0)
		return err
	})
	if !errors.Is(err, ErrWriting) || !strings.Contains(err.Error(), "uint8[4]@cpu") {
		t.Fatalf("Export during Write: %v", err)
	}
	if x.Leases() != 0 || s.Len() != 0 {
		t.Fatalf("a refused Export left %d leases, %d exports", x.Leases(), s.Len())
	}
	func() {
		defer func() { _ = recover() }()
		_ = x.Write(func(memory.Buffer) error { panic("f") })
	}()
	if _, _, err := s.Export(x, "b", 0); err != nil {
		t.Fatalf("Export after Write returned: %v", err)
	}
}

// Export and Write race; each either happens or fails with its sentinel,
// never both at once: a fetch reading the tensor while it is lent never
// sees a Write's bytes change, nor does the lend check, which reads it at
// export and at release (and -race sees no race).
func TestExportWriteRace(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	s.SetLendCheck(func(v LendViolation) { t.Errorf("violation: %v", v) })
	x := hostTensor(t, 256)
	const n = 2000
	var wg sync.WaitGroup
	var wrote, lent int
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := range n {
			err := x.Write(func(buf memory.Buffer) error {
				for j := range buf.Host() {
					buf.Host()[j] = byte(i)
				}
				return nil
			})
			switch {
			case err == nil:
				wrote++
			case !errors.Is(err, ErrLeased):
				t.Errorf("Write: %v", err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range n {
			e, _, err := s.Export(x, "b", 0)
			switch {
			case err == nil:
				lent++
				b := x.Host() // the holder's fetch
				for _, v := range b {
					if v != b[0] {
						t.Errorf("torn read while lent: %d then %d", b[0], v)
						break
					}
				}
				_ = s.Release(e.ID, e.Lease)
			case !errors.Is(err, ErrWriting):
				t.Errorf("Export: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	if x.Leases() != 0 || s.LendViolations() != 0 {
		t.Fatalf("%d leases left, %d violations", x.Leases(), s.LendViolations())
	}
	t.Logf("%d writes, %d exports went through", wrote, lent)
}
