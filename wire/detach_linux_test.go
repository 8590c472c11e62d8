//go:build linux

package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"testing"
	"time"
)

// detached returns c taken out of the runtime's poller, failing the test
// when it stays in.
func detached(t *testing.T, c net.Conn, spin time.Duration) *detachedConn {
	t.Helper()
	dc, ok := newDetachable(c, spin).(*detachedConn)
	if !ok {
		t.Fatal("a TCP connection with a read spin is not detachable")
	}
	dc.detach()
	if !dc.on.Load() {
		t.Fatal("not detached")
	}
	t.Cleanup(func() { _ = dc.Close() })
	return dc
}

func TestDetachableOnlyForTCPWithSpin(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if newDetachable(a, time.Millisecond) != nil {
		t.Error("a pipe is detachable")
	}
	c, _ := tcpPair(t)
	defer c.Close()
	if newDetachable(c, 0) != nil {
		t.Error("a connection without a read spin is detachable")
	}
}

// Bytes flow both ways through a detached connection, whether they come
// while its reader spins or after it waits in poll; the peer's close
// reads as EOF, and the socket is closed once: the count of detached
// connections goes back.
func TestDetachedConnReadsAndWrites(t *testing.T) {
	before := detachedConns.Load()
	for _, spin := range []time.Duration{time.Hour, time.Nanosecond} {
		c, d := tcpPair(t)
		dc := detached(t, c, spin)
		if got := detachedConns.Load(); got != before+1 {
			t.Fatalf("%d detached connections, want %d", got, before+1)
		}
		readsThenEOF(t, fmt.Sprint("spin ", spin), dc, d, func() {
			// A write larger than the socket's buffers waits for the peer
			// to drain them.
			big := bytes.Repeat([]byte{7}, 8<<20)
			read := make(chan error, 1)
			go func() {
				buf := make([]byte, len(big))
				_, err := io.ReadFull(d, buf)
				if err == nil && !bytes.Equal(buf, big) {
					err = errors.New("the bytes differ")
				}
				read <- err
			}()
			if n, err := dc.Write(big); n != len(big) || err != nil {
				t.Errorf("spin %v: wrote %d of %d: %v", spin, n, len(big), err)
			}
			if err := <-read; err != nil {
				t.Errorf("spin %v: the peer read: %v", spin, err)
			}
		})
		if err := dc.Close(); err != nil {
			t.Errorf("spin %v: close: %v", spin, err)
		}
		if err := dc.Close(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("spin %v: second close: %v", spin, err)
		}
		if got := detachedConns.Load(); got != before {
			t.Errorf("%d detached connections after close, want %d", got, before)
		}
	}
}

// A read deadline set in the past from another goroutine ends a Read that
// waits in poll, and one that spins; clearing it lets reads wait again.
func TestDetachedConnReadDeadlineInterrupts(t *testing.T) {
	for _, spin := range []time.Duration{time.Hour, time.Nanosecond} {
		c, d := tcpPair(t)
		defer d.Close()
		dc := detached(t, c, spin)
		errc := make(chan error, 1)
		go func() {
			_, err := dc.Read(make([]byte, 4))
			errc <- err
		}()
		// Interrupt until the Read has ended: it may not wait yet when the
		// first deadline is set, and a deadline set before it starts also
		// ends it.
		var err error
	wait:
		for {
			if err := dc.SetReadDeadline(time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-errc:
				break wait
			case <-time.After(10 * time.Millisecond):
			}
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("spin %v: interrupted read: %v", spin, err)
		}
		if err := dc.SetReadDeadline(time.Time{}); err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 4)
			_, err := io.ReadFull(dc, buf)
			if err == nil && string(buf) != "ping" {
				err = errors.New("read " + string(buf))
			}
			errc <- err
		}()
		if _, err := d.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Errorf("spin %v: read after the deadline was cleared: %v", spin, err)
		}
		// A deadline in the future ends a read that gets nothing.
		if err := dc.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := dc.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("spin %v: read past a future deadline: %v", spin, err)
		}
	}
}

// Close ends a Read waiting in poll and a Write waiting for the peer to
// drain its buffers.
func TestDetachedConnCloseEndsWaits(t *testing.T) {
	c, d := tcpPair(t)
	defer d.Close()
	dc := detached(t, c, time.Nanosecond)
	rerr := make(chan error, 1)
	go func() {
		_, err := dc.Read(make([]byte, 4))
		rerr <- err
	}()
	werr := make(chan error, 1)
	written := make(chan struct{})
	go func() {
		// The peer never reads: this write fills the buffers and waits.
		_, err := dc.Write(make([]byte, 64<<20))
		close(written)
		werr <- err
	}()
	if err := dc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-rerr; err == nil {
		t.Error("a read ended by Close returned no error")
	}
	<-written
	if err := <-werr; err == nil {
		t.Error("a write ended by Close returned no error")
	}
	if _, err := dc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
	if err := dc.SetReadDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("deadline after close: %v", err)
	}
}

// Past maxDetached a connection stays in the runtime's poller and
// still works (its reader spins there).
func TestDetachedConnsAreBounded(t *testing.T) {
	defer func(n int) { maxDetached = n }(maxDetached)
	maxDetached = int(detachedConns.Load()) + 1
	c1, d1 := tcpPair(t)
	defer d1.Close()
	detached(t, c1, time.Millisecond)
	c2, d2 := tcpPair(t)
	defer d2.Close()
	dc := newDetachable(c2, time.Millisecond).(*detachedConn)
	dc.detach()
	defer dc.Close()
	if dc.on.Load() {
		t.Fatal("a connection past the bound was detached")
	}
	if _, err := d2.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(dc, buf); err != nil || string(buf) != "hi" {
		t.Errorf("read %q: %v", buf, err)
	}
}

// A started Conn with a read spin runs detached, unless ReadSpinInPoller
// keeps it in the runtime's poller, and requests and replies flow through
// it either way.
func TestConnDetachedRoundTrips(t *testing.T) {
	for _, inPoller := range []bool{false, true} {
		t.Run(fmt.Sprint("in poller ", inPoller), func(t *testing.T) {
			a, b := tcpPair(t)
			var server *Conn
			server = NewConn(b, Remote{}, ConnOptions{ReadSpin: time.Millisecond, ReadSpinInPoller: inPoller, DirectWrite: true, Handler: func(f Frame) {
				m := f.(*MessageFrame).Message
				m.Target = "reply"
				if err := server.SendMessage(context.Background(), &m); err != nil {
					server.Fail(err)
				}
			}})
			got := make(chan string, 1)
			client := NewConn(a, Remote{}, ConnOptions{ReadSpin: time.Millisecond, ReadSpinInPoller: inPoller, DirectWrite: true, Handler: func(f Frame) {
				got <- string(f.(*MessageFrame).Message.Body)
			}})
			server.Start()
			client.Start()
			defer server.Close(nil)
			defer client.Close(nil)
			for _, c := range []*Conn{client, server} {
				dc, ok := c.nc.(*detachedConn)
				if is := ok && dc.on.Load(); is == inPoller {
					t.Fatalf("a started Conn with a read spin (in poller %v) detached %v: %T", inPoller, is, c.nc)
				}
				if _, tcp := c.nc.(*net.TCPConn); inPoller && !tcp {
					t.Fatalf("kept in the poller, the Conn reads a %T", c.nc)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i := range 100 {
				body := []byte{byte(i), 'x'}
				if err := client.SendMessage(ctx, &Message{Target: "echo", Type: "t", Body: body}); err != nil {
					t.Fatal(err)
				}
				if g := <-got; g != string(body) {
					t.Fatalf("reply %d: %q", i, g)
				}
			}
		})
	}
}

func TestPollTimeout(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		dl   int64
		want int
	}{
		{0, -1},
		{now.UnixNano() + 1, 1},
		{now.UnixNano() + int64(time.Millisecond), 1},
		{now.UnixNano() + int64(time.Millisecond) + 1, 2},
		{now.UnixNano() - 5, 0},
		{now.AddDate(200, 0, 0).UnixNano(), maxPollTimeout},
	} {
		if got := pollTimeout(c.dl, now); got != c.want {
			t.Errorf("pollTimeout(now%+d ns) = %d, want %d", c.dl-now.UnixNano(), got, c.want)
		}
	}
}

func TestUnixNanoOfDeadlines(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Time{}, 0},
		{time.Unix(1, 0), int64(time.Second)},
		{time.Unix(0, 0), 1},
		{time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC), 1},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64},
	} {
		if got := unixNano(c.t); got != c.want {
			t.Errorf("unixNano(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}
