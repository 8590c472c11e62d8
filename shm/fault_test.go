//go:build linux

package shm

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A peer holding the secret that truncates the acceptor's region file
// before it confirms makes the acceptor's read of the proof fault: that is
// a fallback of this upgrade, not a crash of the node.
func TestUpgradeAcceptorRegionTruncated(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, HostID: "h", RingSize: MinRingSize}
	a, b := net.Pipe()
	defer a.Close()
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Upgrade(ctx, b, cfg, false)
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	// The hostile initiator, by hand.
	if err := send(a, &msg{kind: msgOffer, ok: true, host: "h"}); err != nil {
		t.Fatal(err)
	}
	acc, err := readMsg(a, msgAccept)
	if err != nil || !acc.ok {
		t.Fatalf("accept: %+v, %v", acc, err)
	}
	if err := unix.Truncate(filepath.Join(dir, acc.name+".mem"), 0); err != nil {
		t.Fatal(err)
	}
	if err := send(a, &msg{kind: msgConfirm, ok: true}); err != nil {
		t.Fatal(err)
	}
	start, err := readMsg(a, msgStart)
	if err != nil {
		t.Fatal(err)
	}
	if start.ok {
		t.Error("the acceptor started on a truncated region")
	}
	if err := <-errc; !errors.Is(err, ErrFallback) {
		t.Fatalf("acceptor: %v, want a fallback", err)
	}
}

// A region that shrinks after the initiator checked its size (the acceptor
// or another process of this user truncated it) makes the initiator's read
// of the header fault: both ends fall back, neither crashes.
func TestUpgradeInitiatorRegionTruncated(t *testing.T) {
	testHookMapped = func(path string) {
		if err := unix.Truncate(path, 0); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHookMapped = nil }()
	cfg := Config{Dir: t.TempDir(), HostID: "h", RingSize: MinRingSize}
	_, _, ei, ea := upgradePair(t, cfg, cfg)
	if !errors.Is(ei, ErrFallback) || !errors.Is(ea, ErrFallback) {
		t.Fatalf("initiator: %v; acceptor: %v; want both to fall back", ei, ea)
	}
}
