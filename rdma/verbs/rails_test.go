package verbs

import (
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
)

// railCluster is a cluster whose transfers split in 1 MiB slices over the
// rails cfgOf gives (default: every device); it skips without two usable
// RDMA devices.
func railCluster(t *testing.T, cfgOf func(string) Config, names ...string) *cluster {
	t.Helper()
	cl := newClusterCfgs(t, func(n string) Config {
		c := cfgOf(n)
		c.RailMinBytes = 1 << 20
		return c
	}, names...)
	if r := cl.chans[names[len(names)-1]].Rails(); len(r) < 2 {
		t.Skipf("one RDMA device (%v): no second rail", r)
	}
	return cl
}

func allRails(string) Config { return Config{} }

// TestRailsSplitLargeTransfer: 4 MiB over two rails read right, one queue
// pair per rail; 512 KiB stays on one.
func TestRailsSplitLargeTransfer(t *testing.T) {
	cl := railCluster(t, allRails, "owner", "fetcher")
	t.Logf("rails: %v", cl.chans["fetcher"].Rails())
	const n = 4 << 20
	d, _ := cl.export(t, "owner", "fetcher", 50, n)
	dst := hostBuf(t, n)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 50, n)
	if s := cl.chans["fetcher"].Stats(); s.Connections != 2 || s.RailFailovers != 0 {
		t.Errorf("fetcher stats %+v: want a connection per rail, no failover", s)
	}
	small, _ := cl.export(t, "owner", "fetcher", 51, 512<<10)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), small, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 51, 512<<10)
	if got := cl.chans["fetcher"].railsFor(512 << 10); got != 1 {
		t.Errorf("railsFor(512 KiB) = %d", got)
	}
}

// TestRailMissingOnOwner: the owner has one rail, the fetcher two: the
// slice of rail 1 cannot connect and is read over rail 0.
func TestRailMissingOnOwner(t *testing.T) {
	cl := railCluster(t, func(n string) Config {
		if n == "owner" {
			return Config{Rails: 1}
		}
		return Config{}
	}, "owner", "fetcher")
	const n = 4 << 20
	d, _ := cl.export(t, "owner", "fetcher", 52, n)
	dst := hostBuf(t, n)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 52, n)
	if s := cl.chans["fetcher"].Stats(); s.RailFailovers != 1 {
		t.Errorf("fetcher stats %+v: want the slice of rail 1 read over rail 0", s)
	}
}

// TestRailFailsMidTransfer breaks rail 1's queue pair while its reads are
// in flight (as a NIC failing does: its work requests complete in error):
// the slice is read again over rail 0 and the transfer succeeds.
func TestRailFailsMidTransfer(t *testing.T) {
	cl := railCluster(t, allRails, "owner", "fetcher")
	const n = 16 << 20
	d, _ := cl.export(t, "owner", "fetcher", 53, n)
	dst := hostBuf(t, n)
	f := cl.chans["fetcher"]
	res := make(chan error, 1)
	go func() { res <- f.Fetch(fetchCtx(t), d, dst) }()
	var broke bool
	poll.Until(t, "rail 1 reading, or the transfer over", func() bool {
		select {
		case err := <-res:
			res <- err
			return true
		default:
		}
		f.mu.Lock()
		fp := f.fetches[railKey{"owner", 1}]
		f.mu.Unlock()
		if fp == nil {
			return false
		}
		select {
		case <-fp.ready:
		default:
			return false
		}
		if fp.err != nil {
			return false
		}
		fp.mu.Lock()
		pending := len(fp.waiters)
		fp.mu.Unlock()
		if pending == 0 {
			return false
		}
		if err := fp.qp.SetError(); err != nil {
			t.Fatal(err)
		}
		broke = true
		return true
	})
	if err := <-res; err != nil {
		t.Fatalf("fetch with rail 1 failing: %v", err)
	}
	if !broke {
		t.Skip("the transfer finished before rail 1 could be broken")
	}
	checkData(t, dst.Host(), 53, n)
	if s := f.Stats(); s.RailFailovers < 1 {
		t.Errorf("fetcher stats %+v: want a failover", s)
	}
}

// TestRailsAllFailingFailCleanly: with every rail's queue pair broken
// mid-transfer and the owner gone, the transfer fails (no hang, no panic)
// and the channel serves the next one once the owner is back.
func TestRailsAllFailingFailCleanly(t *testing.T) {
	// Soft-RoCE may never complete a read from a destroyed queue pair: the
	// stall timeout ends it, shortened here.
	cl := railCluster(t, func(string) Config {
		var c Config
		c.StallTimeout = 2 * time.Second
		return c
	}, "owner", "fetcher")
	const n = 16 << 20
	d, _ := cl.export(t, "owner", "fetcher", 54, n)
	dst := hostBuf(t, n)
	f := cl.chans["fetcher"]
	ctx, cancel := context.WithCancel(fetchCtx(t))
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- f.Fetch(ctx, d, dst) }()
	poll.Until(t, "reads in flight on a rail, or the transfer over", func() bool {
		select {
		case err := <-res:
			res <- err
			return true
		default:
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, fp := range f.fetches {
			select {
			case <-fp.ready:
			default:
				continue
			}
			if fp.err != nil {
				continue
			}
			fp.mu.Lock()
			pending := len(fp.waiters)
			fp.mu.Unlock()
			if pending > 0 {
				return true
			}
		}
		return false
	})
	// The owner forgets the fetcher (as when it restarts): every rail's
	// queue pair and grant goes, so no rail can serve the export again.
	cl.chans["owner"].PeerDown("fetcher")
	if err := cl.envs["owner"].Store.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
	err := <-res
	if err == nil {
		t.Skip("the transfer finished before the owner dropped it")
	}
	t.Logf("every rail failing: %v (failovers %d)", err, f.Stats().RailFailovers)
	d2, _ := cl.export(t, "owner", "fetcher", 55, 2<<20)
	if err := f.Fetch(fetchCtx(t), d2, dst); err != nil {
		t.Fatalf("fetch after the failed one: %v", err)
	}
	checkData(t, dst.Host(), 55, 2<<20)
}
