//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
	"golang.org/x/sys/unix"
)

// upgradePair upgrades both ends of a socket pair (dir: the shared
// directory) and returns the initiator's and the acceptor's results.
func upgradePair(t *testing.T, ci, ca Config) (ni, na net.Conn, ei, ea error) {
	t.Helper()
	a, b := net.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		na, ea = Upgrade(ctx, b, ca, false)
	}()
	ni, ei = Upgrade(ctx, a, ci, true)
	wg.Wait()
	for _, c := range []net.Conn{ni, na} {
		if c != nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if ei != nil {
		t.Cleanup(func() { a.Close() })
	}
	if ea != nil {
		t.Cleanup(func() { b.Close() })
	}
	return ni, na, ei, ea
}

// connPair returns two upgraded ends with rings of size bytes.
func connPair(t *testing.T, size int, spin time.Duration) (*Conn, *Conn) {
	t.Helper()
	cfg := Config{Dir: t.TempDir(), RingSize: size, Spin: spin}
	ni, na, ei, ea := upgradePair(t, cfg, cfg)
	if ei != nil || ea != nil {
		t.Fatalf("upgrade: %v / %v", ei, ea)
	}
	return ni.(*Conn), na.(*Conn)
}

func TestUpgradeSameHost(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir}
	ni, na, ei, ea := upgradePair(t, cfg, cfg)
	if ei != nil || ea != nil {
		t.Fatalf("upgrade: %v / %v", ei, ea)
	}
	if _, ok := ni.(*Conn); !ok {
		t.Fatalf("initiator got %T", ni)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left in the shared directory: %v", ents)
	}
	echo(t, ni, na)
}

// echo checks that bytes cross both ways.
func echo(t *testing.T, a, b net.Conn) {
	t.Helper()
	go func() { a.Write([]byte("ping")) }()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	go func() { b.Write([]byte("pong")) }()
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestUpgradeFallsBack(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		ci, ca Config
	}{
		{"other hosts", Config{Dir: dir, HostID: "host a"}, Config{Dir: dir, HostID: "host b"}},
		{"initiator disabled", Config{Dir: dir, Disable: true}, Config{Dir: dir}},
		{"acceptor disabled", Config{Dir: dir}, Config{Dir: dir, Disable: true}},
		{"directory not shared", Config{Dir: t.TempDir()}, Config{Dir: t.TempDir()}},
		{"acceptor cannot create", Config{Dir: dir}, Config{Dir: dir + "/missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ni, na, ei, ea := upgradePair(t, tc.ci, tc.ca)
			if !errors.Is(ei, ErrFallback) || !errors.Is(ea, ErrFallback) || ni != nil || na != nil {
				t.Fatalf("got %v / %v, want ErrFallback on both ends", ei, ea)
			}
			t.Log(ei, "|", ea)
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("files left in the shared directory: %v", ents)
			}
		})
	}
}

// TestUpgradeFallbackKeepsSocket: after a fallback both ends go on over
// the socket, in step.
func TestUpgradeFallbackKeepsSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, err := Upgrade(ctx, b, Config{Dir: t.TempDir(), HostID: "b"}, false)
		errc <- err
	}()
	if _, err := Upgrade(ctx, a, Config{Dir: t.TempDir(), HostID: "a"}, true); !errors.Is(err, ErrFallback) {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrFallback) {
		t.Fatal(err)
	}
	echo(t, a, b)
}

func TestUpgradeMalformedPeer(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		b.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		io.Copy(io.Discard, b)
	}()
	_, err := Upgrade(context.Background(), a, Config{Dir: t.TempDir()}, false)
	if err == nil || errors.Is(err, ErrFallback) {
		t.Fatalf("got %v, want a protocol error", err)
	}
	if _, werr := a.Write([]byte{1}); werr == nil {
		t.Error("socket still open after a failed upgrade")
	}
}

func TestUpgradeContextEnds(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// The peer reads the offer and says nothing more.
		readMsg(b, msgOffer)
		cancel()
	}()
	if _, err := Upgrade(ctx, a, Config{Dir: t.TempDir()}, true); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// TestConnStream sends a long stream both ways at once through small
// rings (full and empty rings, wraparound, sleeps on both sides), in
// chunks of random sizes, with and without spinning.
func TestConnStream(t *testing.T) {
	for _, spin := range []time.Duration{-1, 5 * time.Microsecond} {
		t.Run(spin.String(), func(t *testing.T) {
			a, b := connPair(t, MinRingSize, spin)
			const total = 2 << 20
			src := make([]byte, total)
			for i := range src {
				src[i] = byte(rand.Uint32())
			}
			var wg sync.WaitGroup
			check := func(w, r *Conn) {
				defer wg.Done()
				errc := make(chan error, 1)
				go func() {
					rng := rand.New(rand.NewPCG(1, 2))
					for off := 0; off < total; {
						n := min(total-off, 1+rng.IntN(3*MinRingSize))
						if _, err := w.Write(src[off : off+n]); err != nil {
							errc <- err
							return
						}
						off += n
					}
					errc <- nil
				}()
				got := make([]byte, 0, total)
				buf := make([]byte, 777)
				for len(got) < total {
					n, err := r.Read(buf)
					if err != nil {
						t.Errorf("read after %d bytes: %v", len(got), err)
						return
					}
					got = append(got, buf[:n]...)
				}
				if err := <-errc; err != nil {
					t.Error(err)
				}
				if !bytes.Equal(got, src) {
					t.Error("stream arrived altered")
				}
			}
			wg.Add(2)
			go check(a, b)
			go check(b, a)
			wg.Wait()
		})
	}
}

// TestConnCloseDrainsThenEOF: what was written before Close is read, then
// io.EOF; writing to a closed peer fails; the closed end refuses use.
func TestConnCloseDrainsThenEOF(t *testing.T) {
	a, b := connPair(t, MinRingSize, -1)
	if _, err := a.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "last words" {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, err := b.Write([]byte("x")); err == nil {
		t.Error("write to a closed peer succeeded")
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read on a closed Conn: %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write on a closed Conn: %v", err)
	}
}

// TestConnPeerDeath: a sleeping Read and a Write blocked on a full ring
// wake when the peer's socket ends (what the kernel does when the peer
// process dies), though the peer never touched the rings.
func TestConnPeerDeath(t *testing.T) {
	a, b := connPair(t, MinRingSize, -1)
	readErr := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 10))
		readErr <- err
	}()
	writeErr := make(chan error, 1)
	go func() {
		_, err := b.Write(make([]byte, 3*MinRingSize)) // a never reads: blocks
		writeErr <- err
	}()
	a.nc.Close() // only the socket: as if the process were gone
	if err := <-readErr; err != io.EOF {
		t.Errorf("read: %v, want io.EOF", err)
	}
	if err := <-writeErr; err == nil {
		t.Error("write to a dead peer succeeded")
	}
}

// TestConnCloseWakesOwnSleepers: Close ends this end's own Read and Write
// in progress, sleeping or spinning (an hour's spin: only Close ends it).
func TestConnCloseWakesOwnSleepers(t *testing.T) {
	for _, spin := range []time.Duration{-1, time.Hour} {
		t.Run(spin.String(), func(t *testing.T) { testCloseWakes(t, spin) })
	}
}

func testCloseWakes(t *testing.T, spin time.Duration) {
	_, b := connPair(t, MinRingSize, spin)
	errs := make(chan error, 2)
	go func() {
		_, err := b.Read(make([]byte, 10))
		errs <- err
	}()
	go func() {
		_, err := b.Write(make([]byte, 3*MinRingSize))
		errs <- err
	}()
	b.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, net.ErrClosed) {
			t.Errorf("got %v, want net.ErrClosed", err)
		}
	}
}

// TestConnCorruptPeer: garbage index words from the peer make this end's
// Read and Write fail with ErrCorrupt, without touching memory outside the
// rings.
func TestConnCorruptPeer(t *testing.T) {
	a, b := connPair(t, MinRingSize, -1)
	// a plays the malicious peer: it writes b's indices directly.
	a.out.tail.Store(1 << 40)
	if _, err := b.Read(make([]byte, 10)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("read: %v, want ErrCorrupt", err)
	}
	a.in.head.Store(12345)
	if _, err := b.Write([]byte("x")); !errors.Is(err, ErrCorrupt) {
		t.Errorf("write: %v, want ErrCorrupt", err)
	}
}

// TestConnCorruptPeerWakesSleeper: garbage written while this end sleeps
// is found when the peer rings (or at the next wake-up).
func TestConnCorruptPeerWakesSleeper(t *testing.T) {
	a, b := connPair(t, MinRingSize, -1)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 10))
		errc <- err
	}()
	a.out.tail.Store(^uint64(0) - 5)
	a.outData.ring()
	if err := <-errc; !errors.Is(err, ErrCorrupt) {
		t.Errorf("read: %v, want ErrCorrupt", err)
	}
}

func TestConnDeadline(t *testing.T) {
	a, _ := connPair(t, MinRingSize, -1)
	a.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	// A deadline set while a Read sleeps ends it.
	a.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 1))
		errc <- err
	}()
	a.SetReadDeadline(time.Now().Add(time.Millisecond))
	if err := <-errc; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v", err)
	}
	var ne net.Error
	if !errors.As(os.ErrDeadlineExceeded, &ne) || !ne.Timeout() {
		t.Fatal("not a timeout")
	}
}

// TestConnDeadlineEndsSpin: a read deadline set in the past ends a Read
// that spins (a caller reading through wire.Conn.Await is woken that way),
// not only one asleep.
func TestConnDeadlineEndsSpin(t *testing.T) {
	a, _ := connPair(t, MinRingSize, time.Hour)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 1))
		errc <- err
	}()
	poll.Until(t, "the Read runs", func() bool {
		if a.rmu.TryLock() {
			a.rmu.Unlock()
			return false
		}
		return true
	})
	a.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: %v", err)
		}
	case <-time.After(10 * time.Second):
		a.Close() // ends the spin
		<-errc
		t.Fatal("a spinning Read went on past its deadline")
	}
}

// TestConnTruncatedRegion: a peer that truncates the shared file makes
// this end's accesses fault; that is an error of this Conn, not a crash.
func TestConnTruncatedRegion(t *testing.T) {
	dir := t.TempDir()
	var nonce [nonceSize]byte
	reg, name, err := createRegion(dir, MinRingSize, nonce)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir+"/"+name+".mem", unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	reg.unlink()
	x, y := net.Pipe()
	defer y.Close()
	c := newConn(reg, true, x, -1)
	defer c.Close()
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write to a truncated region succeeded")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read from a truncated region succeeded")
	}
}
