//go:build linux

package shm

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUpgradeAcceptorSurvivesTruncation: a peer holding the secret that
// truncates the region's file before it confirms makes the acceptor's read
// of the proof fault; that fails the connection, not the process.
func TestUpgradeAcceptorSurvivesTruncation(t *testing.T) {
	cfg := Config{Dir: t.TempDir()}
	host, err := cfg.hostID()
	if err != nil {
		t.Skip(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Upgrade(ctx, b, cfg, false)
		done <- result{c, err}
	}()
	if err := send(a, &msg{kind: msgOffer, ok: true, host: host}); err != nil {
		t.Fatal(err)
	}
	acc, err := readMsg(a, msgAccept)
	if err != nil || !acc.ok {
		t.Fatalf("accept: %+v, %v", acc, err)
	}
	if err := unix.Truncate(filepath.Join(cfg.Dir, acc.name+".mem"), 0); err != nil {
		t.Fatal(err)
	}
	if err := send(a, &msg{kind: msgConfirm, ok: true}); err != nil {
		t.Fatal(err)
	}
	if start, err := readMsg(a, msgStart); err != nil || start.ok {
		t.Errorf("start after a fault: %+v, %v", start, err)
	}
	r := <-done
	if r.err == nil {
		r.c.Close()
		t.Fatal("the upgrade succeeded on a truncated region")
	}
	if errors.Is(r.err, ErrFallback) || !strings.Contains(r.err.Error(), "faulted") {
		t.Errorf("error %v, want a fault that fails the connection", r.err)
	}
	if n := regionFiles(t, cfg.Dir); n != 0 {
		t.Errorf("%d region files left", n)
	}
}

// TestUpgradeDialerSurvivesShrinkingRegion: the region of a listener whose
// file shrinks between the initiator's size check and its first access
// makes that access fault; the initiator gets an error, not a SIGBUS.
func TestUpgradeDialerSurvivesShrinkingRegion(t *testing.T) {
	cfg := Config{Dir: t.TempDir()}
	testHookMapped = func(path string) {
		if err := unix.Truncate(path, 0); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { testHookMapped = nil })
	ni, na, ei, ea := upgradePair(t, cfg, cfg)
	if ni != nil || na != nil {
		t.Fatal("upgraded over a shrunk region")
	}
	if !errors.Is(ei, ErrFallback) || !strings.Contains(ei.Error(), "faulted") {
		t.Errorf("initiator: %v, want a fallback saying the region faulted", ei)
	}
	if !errors.Is(ea, ErrFallback) {
		t.Errorf("acceptor: %v, want a fallback", ea)
	}
}

func regionFiles(t *testing.T, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, namePrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// TestUpgradeDialerSurvivesShrinkAfterCheck: a region that shrinks after
// the initiator checked its header makes the write of the proof fault; the
// initiator's connection fails, the process goes on.
func TestUpgradeDialerSurvivesShrinkAfterCheck(t *testing.T) {
	cfg := Config{Dir: t.TempDir()}
	testHookChecked = func(path string) {
		// openRegion has unlinked the files by now: truncate them through
		// the link made while they were still there.
		if err := unix.Truncate(path+".keep", 0); err != nil {
			t.Error(err)
		}
	}
	testHookMapped = func(path string) {
		if err := unix.Link(path, path+".keep"); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { testHookChecked, testHookMapped = nil, nil })
	ni, na, ei, ea := upgradePair(t, cfg, cfg)
	if ni != nil || na != nil {
		t.Fatal("upgraded over a shrunk region")
	}
	if ei == nil || errors.Is(ei, ErrFallback) || !strings.Contains(ei.Error(), "faulted") {
		t.Errorf("initiator: %v, want a fault that fails the connection", ei)
	}
	// The acceptor falls back, or finds the pipe closed already by the
	// initiator's failure (net.Pipe's SetDeadline fails then).
	if ea == nil {
		t.Error("acceptor: no error")
	}
}

// TestUpgradeRacingTruncater: a process of this user that truncates every
// region file it sees in the directory, and plants files under names of
// its own, while upgrades run, fails some of them (or leaves them on the
// socket), never the process; upgrades and the Conns they make end with an
// error or work.
func TestUpgradeRacingTruncater(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), RingSize: MinRingSize}
	stop := make(chan struct{})
	racer := make(chan struct{})
	go func() {
		defer close(racer)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			files, _ := filepath.Glob(filepath.Join(cfg.Dir, namePrefix+"*.mem"))
			for _, f := range files {
				_ = unix.Truncate(f, int64(i%3)*pageSize)
			}
			_ = unix.Mkfifo(filepath.Join(cfg.Dir, namePrefix+strings.Repeat("0", 31)+string(rune('0'+i%10))+".mem"), 0o600)
		}
	}()
	for range 100 {
		ni, na, _, _ := upgradePair(t, cfg, cfg)
		if ni != nil && na != nil {
			// Both ends work on the rings, or fail with an error: the
			// read ends with the data, or with the writer's close.
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = na.Write([]byte("ping"))
				na.Close()
			}()
			_, _ = ni.Read(make([]byte, 4))
			ni.Close()
			<-done
		}
	}
	close(stop)
	<-racer
}
