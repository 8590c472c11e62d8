package deadline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestErrWithoutDone: a context nobody waits on ends when its deadline
// passes (Err looks at the clock), and its Done, asked for afterwards, is
// closed.
func TestErrWithoutDone(t *testing.T) {
	ctx, cancel := WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
	if !isClosed(ctx.Done()) {
		t.Fatal("Done not closed after Err reported the end")
	}
	cancel()
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err after cancel = %v, want DeadlineExceeded still", err)
	}
}

// TestDoneClosesAtDeadline: Done arms the timer; it closes at the deadline
// and Err then reports it.
func TestDoneClosesAtDeadline(t *testing.T) {
	ctx, cancel := WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err before the deadline = %v", err)
	}
	<-ctx.Done()
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
}

// TestCancel: cancel ends the context, before or after Done was asked for.
func TestCancel(t *testing.T) {
	for _, armed := range []bool{false, true} {
		ctx, cancel := WithTimeout(context.Background(), time.Hour)
		var done <-chan struct{}
		if armed {
			done = ctx.Done()
			if isClosed(done) {
				t.Fatal("Done closed before cancel")
			}
		}
		cancel()
		if err := ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("armed=%v: Err = %v, want Canceled", armed, err)
		}
		if !isClosed(ctx.Done()) {
			t.Fatalf("armed=%v: Done not closed after cancel", armed)
		}
		if armed && !isClosed(done) {
			t.Fatal("the Done channel handed out before cancel is not closed")
		}
	}
}

// TestParent: the parent's end reaches the context through Err (nobody
// waiting) and through Done (armed); the parent's earlier deadline is the
// context's.
func TestParent(t *testing.T) {
	parent, pcancel := context.WithCancel(context.Background())
	ctx, cancel := WithTimeout(parent, time.Hour)
	defer cancel()
	pcancel()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err = %v, want the parent's Canceled", err)
	}

	parent, pcancel = context.WithCancel(context.Background())
	defer pcancel()
	ctx2, cancel2 := WithTimeout(parent, time.Hour)
	defer cancel2()
	done := ctx2.Done()
	pcancel()
	<-done
	if err := ctx2.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err = %v, want the parent's Canceled", err)
	}

	pd := time.Now().Add(time.Minute)
	parent3, cancel3 := context.WithDeadline(context.Background(), pd)
	defer cancel3()
	ctx3, cancel4 := WithTimeout(parent3, time.Hour)
	defer cancel4()
	if d, ok := ctx3.Deadline(); !ok || !d.Equal(pd) {
		t.Fatalf("Deadline = %v %v, want the parent's %v", d, ok, pd)
	}
}

// TestNested: a context of this package under another one, and a standard
// child under it, end at the outer deadline, with or without waiting.
func TestNested(t *testing.T) {
	outer, cancel := WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	inner, cancel2 := WithTimeout(outer, time.Hour)
	defer cancel2()
	child, cancel3 := context.WithCancel(inner)
	defer cancel3()
	<-child.Done()
	if !errors.Is(inner.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Fatalf("inner %v, child %v, want DeadlineExceeded", inner.Err(), child.Err())
	}
}

// TestConcurrent: Err, Done and cancel from many goroutines agree (run
// with -race).
func TestConcurrent(t *testing.T) {
	for range 50 {
		ctx, cancel := WithTimeout(context.Background(), time.Duration(100+time.Now().UnixNano()%100)*time.Microsecond)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				switch i % 3 {
				case 0:
					<-ctx.Done()
					if ctx.Err() == nil {
						t.Error("Done closed, Err nil")
					}
				case 1:
					for ctx.Err() == nil {
					}
					if !isClosed(ctx.Done()) {
						t.Error("Err set, Done open")
					}
				default:
					if i == 2 {
						cancel()
					}
				}
			})
		}
		wg.Wait()
		cancel()
	}
}

// TestValue: values come from the parent.
func TestValue(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	ctx, cancel := WithTimeout(parent, time.Hour)
	defer cancel()
	if v := ctx.Value(key{}); v != "v" {
		t.Fatalf("Value = %v", v)
	}
}

func BenchmarkWithTimeoutErr(b *testing.B) {
	b.ReportAllocs()
	for range b.N {
		ctx, cancel := WithTimeout(context.Background(), time.Minute)
		_ = ctx.Err()
		cancel()
	}
}

func BenchmarkStdlibWithTimeoutErr(b *testing.B) {
	b.ReportAllocs()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = ctx.Err()
		cancel()
	}
}

// TestTimeoutDeadline: WithTimeout's deadline, taken on the monotonic clock
// alone, is time.Now().Add(timeout) as the wall clock reads it too; the
// parent's earlier deadline wins; a timeout too large to add does not
// overflow into the past.
func TestTimeoutDeadline(t *testing.T) {
	before := time.Now()
	ctx, cancel := WithTimeout(context.Background(), time.Hour)
	defer cancel()
	after := time.Now()
	d, ok := ctx.Deadline()
	if !ok || d.Before(before.Add(time.Hour)) || d.After(after.Add(time.Hour)) {
		t.Fatalf("Deadline = %v, %v; want between %v and %v", d, ok, before.Add(time.Hour), after.Add(time.Hour))
	}
	// The wall clock agrees, to the skew between the two clocks.
	if w := d.Round(0); w.Before(before.Add(time.Hour).Add(-time.Second)) || w.After(after.Add(time.Hour).Add(time.Second)) {
		t.Fatalf("Deadline's wall clock %v, want about %v", w, before.Add(time.Hour))
	}

	parent, pcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer pcancel()
	child, ccancel := WithTimeout(parent, time.Hour)
	defer ccancel()
	if pd, _ := parent.Deadline(); !sameTime(child, pd) {
		t.Fatalf("child's deadline is not the parent's earlier one")
	}
	if err := child.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err under an ended parent = %v", err)
	}

	huge, hcancel := WithTimeout(context.Background(), time.Duration(1<<63-1))
	defer hcancel()
	if err := huge.Err(); err != nil {
		t.Fatalf("Err with the largest timeout = %v, want nil", err)
	}
}

func sameTime(ctx context.Context, want time.Time) bool {
	d, ok := ctx.Deadline()
	return ok && d.Equal(want)
}
