//go:build linux

package shm

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// limitedPair upgrades both ends of a socket pair, the acceptor within l
// for the peer named peer.
func limitedPair(t *testing.T, cfg Config, l *Limits, peer string) (ni, na net.Conn, ei, ea error) {
	t.Helper()
	a, b := net.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		na, ea = l.Upgrade(ctx, b, cfg, false, peer)
	}()
	ni, ei = Upgrade(ctx, a, cfg, true)
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range []net.Conn{ni, na, a, b} {
			if c != nil {
				c.Close()
			}
		}
	})
	return ni, na, ei, ea
}

// TestLimitsOneInFlightPerName: while one upgrade with a peer is in flight
// (its region made, the confirmation awaited), another with the same name
// is declined without making a region; one with another name goes on.
func TestLimitsOneInFlightPerName(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), RingSize: MinRingSize}
	host, err := cfg.hostID()
	if err != nil {
		t.Skip(err)
	}
	l := NewLimits(cfg)
	a, b := net.Pipe()
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Upgrade(ctx, b, cfg, false, "p")
		done <- err
	}()
	if err := send(a, &msg{kind: msgOffer, ok: true, host: host}); err != nil {
		t.Fatal(err)
	}
	if acc, err := readMsg(a, msgAccept); err != nil || !acc.ok {
		t.Fatalf("accept: %+v, %v", acc, err)
	}
	// The first upgrade now waits for its confirmation.
	for range 20 {
		_, _, ei, ea := limitedPair(t, cfg, l, "p")
		if !errors.Is(ea, ErrRefused) || !errors.Is(ea, ErrFallback) || !errors.Is(ei, ErrFallback) {
			t.Fatalf("second upgrade with p: %v / %v, want a refusal and a fallback", ei, ea)
		}
	}
	if n := regionFiles(t, cfg.Dir); n != 5 {
		t.Errorf("%d region files, want the first upgrade's 5", n)
	}
	if ni, na, ei, ea := limitedPair(t, cfg, l, "q"); ei != nil || ea != nil {
		t.Fatalf("upgrade with q: %v / %v", ei, ea)
	} else {
		echo(t, ni, na)
	}
	cancel()
	if err := <-done; err == nil || errors.Is(err, ErrFallback) {
		t.Errorf("abandoned upgrade: %v", err)
	}
	if n := regionFiles(t, cfg.Dir); n != 0 {
		t.Errorf("%d region files left", n)
	}
	if ni, na, ei, ea := limitedPair(t, cfg, l, "p"); ei != nil || ea != nil {
		t.Fatalf("upgrade with p after the first ended: %v / %v", ei, ea)
	} else {
		ni.Close()
		na.Close()
	}
}

// TestLimitsBudget: regions count against the budget while established and
// are given back when their Conn closes; an upgrade past it stays on the
// socket.
func TestLimitsBudget(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), RingSize: MinRingSize}
	one := int64(regionSize(MinRingSize))
	cfg.RegionBudget = 2 * one
	l := NewLimits(cfg)
	var conns []net.Conn
	for _, p := range []string{"a", "b"} {
		ni, na, ei, ea := limitedPair(t, cfg, l, p)
		if ei != nil || ea != nil {
			t.Fatalf("upgrade with %s: %v / %v", p, ei, ea)
		}
		conns = append(conns, ni, na)
	}
	if u := l.Used(); u != 2*one {
		t.Fatalf("%d bytes counted, want %d", u, 2*one)
	}
	if _, _, ei, ea := limitedPair(t, cfg, l, "c"); !errors.Is(ea, ErrRefused) || !errors.Is(ei, ErrFallback) {
		t.Fatalf("upgrade past the budget: %v / %v, want a refusal", ei, ea)
	}
	for _, c := range conns {
		c.Close()
	}
	if u := l.Used(); u != 0 {
		t.Fatalf("%d bytes counted after Close, want 0", u)
	}
	if _, _, ei, ea := limitedPair(t, cfg, l, "c"); ei != nil || ea != nil {
		t.Fatalf("upgrade within the budget again: %v / %v", ei, ea)
	}
}
