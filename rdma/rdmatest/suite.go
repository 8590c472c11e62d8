package rdmatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// Pair is the two ends of a transfer as the suite sees them: a fetcher
// channel and an owner it can export on.
type Pair struct {
	// Fetcher is the channel under test, on the fetching node.
	Fetcher rdma.Channel
	// FetchDevice is where destinations are allocated; OwnerDevice where the
	// owner keeps its exports.
	FetchDevice memory.Device
	OwnerDevice memory.Device
	// ChunkSize is the channel's chunk size, for the chunk-boundary cases
	// (0: no chunking; the boundary cases use 4 MiB).
	ChunkSize int
	// Export makes the owner export a uint8 tensor of shape {size} holding
	// Fill(seed)'s first size bytes, and returns its descriptor with the
	// owner's offers for the fetcher.
	Export func(t testing.TB, seed uint64, size int) *tensor.Descriptor
	// Release ends the export's lease on the owner.
	Release func(t testing.TB, d *tensor.Descriptor) error
	// Kill kills the owner abruptly; nil skips the peer-killed case.
	Kill func()
	// Check returns an error if the owner still holds resources for finished
	// transfers (acquisitions of released exports, transfers in flight,
	// registrations, mappings). The suite retries it for a few seconds.
	Check func() error
}

// TestChannel runs the conformance suite. makePair is called once for each
// group of cases and must register its own cleanup with t.Cleanup.
func TestChannel(t *testing.T, makePair func(t *testing.T) *Pair) {
	t.Run("sizes", func(t *testing.T) {
		p := makePair(t)
		chunk := p.ChunkSize
		if chunk <= 0 {
			chunk = 4 << 20
		}
		sizes := []int{0, 1, 7, 4095, 4096, 4097, 65536 + 13, chunk - 1, chunk, chunk + 1,
			2*chunk - 1, 2 * chunk, 2*chunk + 1, 1<<20 + 3, 5*chunk + chunk/2, 64 << 20}
		seen := map[int]bool{}
		for i, n := range sizes {
			if seen[n] {
				continue
			}
			seen[n] = true
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				roundTrip(t, p, uint64(1000+i), n)
			})
		}
		check(t, p)
	})
	t.Run("1GiB", func(t *testing.T) {
		if testing.Short() {
			t.Skip("1 GiB transfer skipped in -short mode")
		}
		if raceEnabled && os.Getenv("RDMATEST_1GIB_RACE") == "" {
			t.Skip("1 GiB transfer skipped under the race detector (fill and compare are too slow instrumented)")
		}
		p := makePair(t)
		start := time.Now()
		roundTrip(t, p, 42, 1<<30)
		t.Logf("1 GiB round trip with fill and compare: %v", time.Since(start))
		check(t, p)
	})
	t.Run("repeat", func(t *testing.T) {
		p := makePair(t)
		const n = 3<<20 + 5
		d := p.Export(t, 7, n)
		for range 3 {
			fetchInto(t, p, d, 7, n, 64)
		}
		if err := p.Release(t, d); err != nil {
			t.Fatalf("release: %v", err)
		}
		check(t, p)
	})
	t.Run("concurrent", func(t *testing.T) {
		p := makePair(t)
		chunk := max(p.ChunkSize, 64<<10)
		const workers = 32
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			n := (w*7919)%(3*chunk) + w
			d := p.Export(t, uint64(5000+w), n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- fetchCheck(p, d, uint64(5000+w), n)
			}()
			t.Cleanup(func() { _ = p.Release(t, d) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		p := makePair(t)
		testCancel(t, p)
	})
	t.Run("errors", func(t *testing.T) {
		p := makePair(t)
		testErrors(t, p)
	})
	t.Run("kill", func(t *testing.T) {
		p := makePair(t)
		if p.Kill == nil {
			t.Skip("the pair has no separate owner to kill")
		}
		testKill(t, p)
	})
}

// roundTrip exports n bytes of seed's data, fetches them into a poisoned
// destination with a tail, compares, releases and checks.
func roundTrip(t *testing.T, p *Pair, seed uint64, n int) {
	t.Helper()
	d := p.Export(t, seed, n)
	fetchInto(t, p, d, seed, n, 4096)
	if err := p.Release(t, d); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func fetchInto(t *testing.T, p *Pair, d *tensor.Descriptor, seed uint64, n, tail int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dst, err := allocPoisoned(ctx, p.FetchDevice, n+tail)
	if err != nil {
		t.Fatalf("allocating the destination: %v", err)
	}
	defer dst.Free()
	if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
		t.Fatalf("fetch %d bytes: %v", n, err)
	}
	got, free, err := hostView(ctx, dst)
	if err != nil {
		t.Fatalf("reading the destination back: %v", err)
	}
	defer free()
	if err := verify(got, seed, n); err != nil {
		t.Fatalf("fetch %d bytes: %v", n, err)
	}
}

func fetchCheck(p *Pair, d *tensor.Descriptor, seed uint64, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dst, err := allocPoisoned(ctx, p.FetchDevice, n+17)
	if err != nil {
		return err
	}
	defer dst.Free()
	if err := p.Fetcher.Fetch(ctx, d, dst); err != nil {
		return fmt.Errorf("fetch %d bytes: %w", n, err)
	}
	got, free, err := hostView(ctx, dst)
	if err != nil {
		return err
	}
	defer free()
	if err := verify(got, seed, n); err != nil {
		return fmt.Errorf("fetch %d bytes: %w", n, err)
	}
	return nil
}

// check retries p.Check for a few seconds: an owner may finish serving a
// cancelled transfer a little after the fetcher returned.
func check(t *testing.T, p *Pair) {
	t.Helper()
	if p.Check == nil {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := p.Check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("owner still holds resources: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bigSize is the size of the transfers that are interrupted (cancelled,
// owner killed): large enough to be surely in flight when interrupted.
func bigSize() int {
	if raceEnabled {
		return 64 << 20 // the race detector slows everything down
	}
	return 256 << 20
}

func testCancel(t *testing.T, p *Pair) {
	n := bigSize()
	d := p.Export(t, 99, n)
	dst, err := allocPoisoned(context.Background(), p.FetchDevice, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()

	t.Run("before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := p.Fetcher.Fetch(ctx, d, dst); !errors.Is(err, context.Canceled) {
			t.Fatalf("fetch with a cancelled context: %v, want context.Canceled", err)
		}
	})
	t.Run("mid-transfer", func(t *testing.T) {
		for _, after := range []time.Duration{time.Millisecond, 10 * time.Millisecond} {
			ctx, cancel := context.WithCancel(context.Background())
			res := make(chan error, 1)
			go func() { res <- p.Fetcher.Fetch(ctx, d, dst) }()
			time.Sleep(after)
			cancel()
			canceled := time.Now()
			select {
			case err := <-res:
				if took := time.Since(canceled); took > 2*time.Second {
					t.Errorf("fetch returned %v after cancel", took)
				}
				if err == nil {
					t.Logf("transfer finished within %v, before the cancel", after)
				} else if !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled fetch: %v, want context.Canceled", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("cancelled fetch did not return within 30 s")
			}
		}
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		defer cancel()
		err := p.Fetcher.Fetch(ctx, d, dst)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("fetch past its deadline: %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("after", func(t *testing.T) {
		// The channel still works, and the data is right.
		fetchInto(t, p, d, 99, n, 0)
	})
	if err := p.Release(t, d); err != nil {
		t.Fatalf("release: %v", err)
	}
	check(t, p)
}

func testErrors(t *testing.T, p *Pair) {
	const n = 100000
	d := p.Export(t, 3, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mutate := func(f func(d *tensor.Descriptor)) *tensor.Descriptor {
		c := *d
		f(&c)
		return &c
	}
	released := p.Export(t, 4, n)
	if err := p.Release(t, released); err != nil {
		t.Fatalf("release: %v", err)
	}
	cases := []struct {
		name string
		d    *tensor.Descriptor
		dst  int
		want error
	}{
		{"too-small", d, n - 1, rdma.ErrTooSmall},
		{"unknown-export", mutate(func(d *tensor.Descriptor) { d.ExportID += 1 << 40 }), n, tensor.ErrUnknownExport},
		{"released", released, n, tensor.ErrUnknownExport},
		{"wrong-lease", mutate(func(d *tensor.Descriptor) { d.Lease ^= 0x5a5a5a5a }), n, tensor.ErrBadLease},
		{"stale-incarnation", mutate(func(d *tensor.Descriptor) { d.Incarnation++ }), n, tensor.ErrStale},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst, err := allocPoisoned(ctx, p.FetchDevice, tc.dst)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			err = p.Fetcher.Fetch(ctx, tc.d, dst)
			if !errors.Is(err, tc.want) {
				t.Fatalf("fetch: %v, want %v", err, tc.want)
			}
			got, free, err := hostView(ctx, dst)
			if err != nil {
				t.Fatal(err)
			}
			defer free()
			if tc.want == rdma.ErrTooSmall {
				if err := verify(got, 0, 0); err != nil {
					t.Errorf("failed fetch wrote the destination: %v", err)
				}
			}
		})
	}
	t.Run("still-works", func(t *testing.T) {
		fetchInto(t, p, d, 3, n, 100)
	})
	if err := p.Release(t, d); err != nil {
		t.Fatalf("release: %v", err)
	}
	check(t, p)
}

func testKill(t *testing.T, p *Pair) {
	n := bigSize()
	d := p.Export(t, 11, n)
	dst, err := allocPoisoned(context.Background(), p.FetchDevice, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- p.Fetcher.Fetch(ctx, d, dst) }()
	time.Sleep(5 * time.Millisecond)
	p.Kill()
	select {
	case err := <-res:
		if err == nil {
			t.Log("transfer finished before the owner was killed")
		} else if ctx.Err() != nil {
			t.Fatalf("fetch ran into its deadline instead of failing: %v", err)
		} else {
			t.Logf("fetch from a killed owner: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fetch from a killed owner hangs")
	}
	// A new fetch from the dead owner fails promptly.
	start := time.Now()
	if err := p.Fetcher.Fetch(ctx, d, dst); err == nil {
		t.Fatal("fetch from a killed owner succeeded")
	} else if ctx.Err() != nil {
		t.Fatalf("fetch from a killed owner ran into its deadline: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("fetch from a killed owner took %v", took)
	}
	check(t, p)
}
