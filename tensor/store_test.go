package tensor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

func hostTensor(t *testing.T, n int) *Tensor {
	t.Helper()
	x, err := New(memory.CPU, Uint8, Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestStoreExportAcquireRelease(t *testing.T) {
	s := NewStore("a", 5)
	if s.Node() != "a" || s.Incarnation() != 5 {
		t.Fatal("node or incarnation")
	}
	x := hostTensor(t, 12)
	e, d, err := s.Export(x, "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Owner != "a" || d.Incarnation != 5 || d.ExportID != e.ID || d.Lease != e.Lease || d.Bytes != 12 ||
		d.Device != "cpu" || d.DType != Uint8 || !d.Shape.Equal(Shape{12}) || e.Holder != "b" || !e.Deadline.IsZero() {
		t.Fatalf("descriptor %v / export %+v", d, e)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if x.Leases() != 1 || s.Len() != 1 {
		t.Fatalf("leases %d, len %d", x.Leases(), s.Len())
	}
	if err := x.Free(); !errors.Is(err, ErrLeased) {
		t.Fatalf("Free while leased: %v", err)
	}
	got, done, err := s.Acquire(5, d.ExportID, d.Lease)
	if err != nil || got.Tensor != x {
		t.Fatalf("Acquire: %v", err)
	}
	tests := []struct {
		name           string
		inc, id, lease uint64
		want           error
	}{
		{"unknown id", 5, d.ExportID + 1, d.Lease, ErrUnknownExport},
		{"id zero", 5, 0, d.Lease, ErrUnknownExport},
		{"wrong lease", 5, d.ExportID, d.Lease + 1, ErrBadLease},
		{"stale incarnation", 4, d.ExportID, d.Lease, ErrStale},
		{"future incarnation", 6, d.ExportID, d.Lease, ErrStale},
	}
	for _, tc := range tests {
		if _, _, err := s.Acquire(tc.inc, tc.id, tc.lease); !errors.Is(err, tc.want) {
			t.Errorf("%s: Acquire: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := s.Release(d.ExportID, d.Lease+1); !errors.Is(err, ErrBadLease) {
		t.Errorf("Release with a wrong lease: %v", err)
	}
	// Released while acquired: the tensor stays lent until done.
	if err := s.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
	if x.Leases() != 1 || s.Len() != 0 {
		t.Fatalf("after release with an acquisition: leases %d, len %d", x.Leases(), s.Len())
	}
	if _, _, err := s.Acquire(5, d.ExportID, d.Lease); !errors.Is(err, ErrUnknownExport) {
		t.Errorf("Acquire after Release: %v", err)
	}
	done()
	done() // idempotent
	if x.Leases() != 0 {
		t.Fatalf("after done: %d leases", x.Leases())
	}
	if err := s.Release(d.ExportID, d.Lease); !errors.Is(err, ErrUnknownExport) {
		t.Errorf("second Release: %v", err)
	}
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
}

func TestStoreLeasesCountPerExport(t *testing.T) {
	s := NewStore("a", 1)
	x := hostTensor(t, 4)
	_, d1, _ := s.Export(x, "b", 0)
	_, d2, _ := s.Export(x, "c", 0)
	if d1.ExportID == d2.ExportID || d1.Lease == d2.Lease || x.Leases() != 2 {
		t.Fatalf("two exports: %v %v, %d leases", d1, d2, x.Leases())
	}
	// Release racing with the end of an acquisition drops one lease, once.
	for range 2000 {
		_, d, _ := s.Export(x, "b", 0)
		_, done, err := s.Acquire(1, d.ExportID, d.Lease)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); done() }()
		go func() { defer wg.Done(); _ = s.Release(d.ExportID, d.Lease) }()
		wg.Wait()
		if n := x.Leases(); n != 2 {
			t.Fatalf("%d leases after a release racing an acquisition, want 2", n)
		}
	}
	_ = s.Release(d1.ExportID, d1.Lease)
	_ = s.Release(d2.ExportID, d2.Lease)
	if x.Leases() != 0 {
		t.Fatalf("%d leases", x.Leases())
	}
}

func TestStoreTTL(t *testing.T) {
	s := NewStore("a", 1)
	x := hostTensor(t, 4)
	var mu sync.Mutex
	var ended []uint64
	s.OnEnd(func(e *Export) {
		mu.Lock()
		ended = append(ended, e.ID)
		mu.Unlock()
	})
	e, d, err := s.Export(x, "b", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if e.Deadline.IsZero() {
		t.Error("no deadline")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease did not expire: %v", err)
	}
	if _, _, err := s.Acquire(1, d.ExportID, d.Lease); !errors.Is(err, ErrUnknownExport) {
		t.Errorf("Acquire after expiry: %v", err)
	}
	mu.Lock()
	if len(ended) != 1 || ended[0] != d.ExportID {
		t.Errorf("OnEnd calls: %v", ended)
	}
	mu.Unlock()
	// A ttl so short that the timer may fire before Export returns.
	for range 200 {
		if _, _, err := s.Export(x, "b", time.Nanosecond); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("leases with a 1 ns ttl never ended: %d left", x.Leases())
	}
	// Released before the deadline: the timer is stopped.
	_, d, _ = s.Export(x, "b", time.Hour)
	if err := s.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
}

func TestStoreReleaseHolder(t *testing.T) {
	s := NewStore("a", 1)
	x, y := hostTensor(t, 4), hostTensor(t, 8)
	var ends int
	s.OnEnd(func(*Export) { ends++ })
	_, db1, _ := s.Export(x, "b", 0)
	_, _, _ = s.Export(y, "b", time.Hour)
	_, dc, _ := s.Export(x, "c", 0)
	_, acquiredDone, err := s.Acquire(1, db1.ExportID, db1.Lease)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.ReleaseHolder("b"); n != 2 {
		t.Fatalf("ReleaseHolder ended %d exports, want 2", n)
	}
	if n := s.ReleaseHolder("nobody"); n != 0 {
		t.Fatalf("ReleaseHolder of an unknown holder ended %d", n)
	}
	if ends != 2 || s.Len() != 1 || y.Leases() != 0 || x.Leases() != 2 {
		t.Fatalf("ends %d len %d leases x %d y %d", ends, s.Len(), x.Leases(), y.Leases())
	}
	acquiredDone()
	if x.Leases() != 1 {
		t.Fatalf("x leases %d after the acquisition ended", x.Leases())
	}
	if _, _, err := s.Acquire(1, dc.ExportID, dc.Lease); err != nil {
		t.Fatalf("other holder's export: %v", err)
	}
	_ = s.Release(dc.ExportID, dc.Lease)
}

func TestStoreClose(t *testing.T) {
	s := NewStore("a", 1)
	x := hostTensor(t, 4)
	_, d, _ := s.Export(x, "b", time.Hour)
	_, _, _ = s.Export(x, "c", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- x.WaitReleased(ctx) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitReleased returned while leased: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	s.Close()
	if err := <-waited; err != nil {
		t.Fatalf("WaitReleased after Close: %v", err)
	}
	if s.Len() != 0 || x.Leases() != 0 {
		t.Fatalf("after Close: len %d leases %d", s.Len(), x.Leases())
	}
	if _, _, err := s.Export(x, "b", 0); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Export after Close: %v", err)
	}
	if _, _, err := s.Acquire(1, d.ExportID, d.Lease); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
	if x.Leases() != 0 {
		t.Errorf("a refused Export left %d leases", x.Leases())
	}
	s.Close() // twice is fine
}

func TestWaitReleasedHonoursContext(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	x := hostTensor(t, 4)
	_, _, _ = s.Export(x, "b", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := x.WaitReleased(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReleased: %v", err)
	}
}

// TestStoreExportContent: exports of a tensor while it is lent share a
// Content; once every lease ended (the owner may write), the next export
// names new content.
func TestStoreExportContent(t *testing.T) {
	s := NewStore("a", 1)
	defer s.Close()
	x, _ := FromFloat32s([]float32{1, 2}, Shape{2})
	y, _ := FromFloat32s([]float32{1, 2}, Shape{2})
	_, d1, err := s.Export(x, "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, d2, _ := s.Export(x, "c", 0)
	_, dy, _ := s.Export(y, "b", 0)
	if d1.Content == 0 || d1.Content != d2.Content || dy.Content == d1.Content {
		t.Fatalf("contents %d %d (same tensor), %d (another)", d1.Content, d2.Content, dy.Content)
	}
	_ = s.Release(d1.ExportID, d1.Lease)
	_, d3, _ := s.Export(x, "b", 0)
	if d3.Content != d1.Content {
		t.Fatalf("lent throughout: content %d, then %d", d1.Content, d3.Content)
	}
	_ = s.Release(d2.ExportID, d2.Lease)
	_ = s.Release(d3.ExportID, d3.Lease)
	if err := x.Write(func(memory.Buffer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	_, d4, _ := s.Export(x, "b", 0)
	if d4.Content == d1.Content {
		t.Fatalf("lent again after its leases ended: same content %d", d4.Content)
	}
}
