package memnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/memnet"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair dials from host "a" to a listener of host "b" and returns both ends.
func pair(t *testing.T, n *memnet.Network) (client, server net.Conn) {
	t.Helper()
	ln, err := n.Host("b").Listen("b:1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	client, err = n.Host("a").DialContext(t.Context(), "b:1")
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestConn runs the net.Conn conformance suite of x/net/nettest: deadlines,
// Close, concurrent use, and bytes in order.
func TestConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		n := memnet.New(1)
		ln, err := n.Listen("srv")
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		c1, err = n.DialContext(context.Background(), "srv")
		if err != nil {
			return nil, nil, nil, err
		}
		c2, err = ln.Accept()
		if err != nil {
			return nil, nil, nil, err
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

func TestAddrs(t *testing.T) {
	c, s := pair(t, memnet.New(1))
	if c.RemoteAddr().String() != "b:1" || s.LocalAddr().String() != "b:1" {
		t.Fatalf("listener address: %v %v", c.RemoteAddr(), s.LocalAddr())
	}
	if c.LocalAddr() != s.RemoteAddr() || c.LocalAddr().Network() != "memnet" {
		t.Fatalf("dialer address: %v %v", c.LocalAddr(), s.RemoteAddr())
	}
	if a := c.LocalAddr().(memnet.Addr); a.Host != "a" {
		t.Fatalf("dialer host %q", a.Host)
	}
}

func TestEOFAndClose(t *testing.T) {
	c, s := pair(t, memnet.New(1))
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// The bytes written before Close are read first, then io.EOF.
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to a closed peer: %v", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed end: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDeadlines(t *testing.T) {
	n := memnet.New(1)
	n.SetBufferSize(4)
	c, s := pair(t, n)

	// A read deadline in the past fails at once, as a timeout.
	_ = s.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := s.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	// Cleared, the read gets the bytes.
	_ = s.SetReadDeadline(time.Time{})
	go func() { _, _ = c.Write([]byte("x")) }()
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	// A write blocked on a full buffer is released by its deadline, with
	// the count of what was buffered.
	done := make(chan error, 1)
	go func() {
		k, err := c.Write([]byte("123456"))
		if k != 4 {
			err = errors.Join(err, errors.New("wrote a count other than the buffer size"))
		}
		done <- err
	}()
	// The deadline is set while the write may already wait: it applies.
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %v", err)
	}
}

func TestDialErrors(t *testing.T) {
	n := memnet.New(1)
	if _, err := n.DialContext(t.Context(), "nowhere"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to no listener: %v", err)
	}
	ln, err := n.Listen("x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Listen("x"); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen twice: %v", err)
	}
	accepted := make(chan error, 1)
	go func() { _, err := ln.Accept(); accepted <- err }()
	ln.Close()
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if _, err := n.DialContext(t.Context(), "x"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed listener: %v", err)
	}
	// The address is free again.
	ln, err = n.Listen("x")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

// quiet asserts that nothing can be read from c within a short deadline:
// the only way to see silence.
func quiet(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if k, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v across a stalled link", k, err)
	}
	_ = c.SetReadDeadline(time.Time{})
}

func TestPartitionAndHeal(t *testing.T) {
	n := memnet.New(1)
	c, s := pair(t, n)
	n.Partition([]string{"a"}, []string{"b"})
	// A dial across is refused; within a group it works.
	if _, err := n.Host("a").DialContext(t.Context(), "b:1"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial across a partition: %v", err)
	}
	ln, err := n.Host("b").Listen("b:2")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	same, err := n.Host("b").DialContext(t.Context(), "b:2")
	if err != nil {
		t.Fatalf("dial within a group: %v", err)
	}
	same.Close()
	// An open connection stalls: the write is buffered, not delivered.
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	quiet(t, s)
	// Healed, the held bytes arrive.
	n.Heal()
	got := make([]byte, 4)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "held" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
}

func TestStallBlocksWritersAndDials(t *testing.T) {
	n := memnet.New(1)
	n.SetBufferSize(8)
	c, s := pair(t, n)
	n.Stall("b", "a") // either order names the link
	// Writes fill the buffer, then block until the link heals.
	wrote := make(chan error, 1)
	go func() { _, err := c.Write(bytes.Repeat([]byte("x"), 20)); wrote <- err }()
	quiet(t, s)
	// A dial across the stalled link waits: until its context ends...
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := n.Host("a").DialContext(ctx, "b:1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial across a stall: %v", err)
	}
	// ...or until the link heals.
	dialed := make(chan error, 1)
	go func() {
		d, err := n.Host("a").DialContext(t.Context(), "b:1")
		if err == nil {
			d.Close()
		}
		dialed <- err
	}()
	n.Heal()
	if err := <-dialed; err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	if _, err := io.ReadFull(s, make([]byte, 20)); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

func TestCut(t *testing.T) {
	n := memnet.New(1)
	c, s := pair(t, n)
	read := make(chan error, 1)
	go func() { _, err := s.Read(make([]byte, 1)); read <- err }()
	n.Cut("a", "b")
	if err := <-read; !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read on a cut connection: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write on a cut connection: %v", err)
	}
}

func TestResetRate(t *testing.T) {
	n := memnet.New(1)
	c, _ := pair(t, n)
	n.ResetRate("a", "b", 1)
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write with reset rate 1: %v", err)
	}
}

// TestDelayKeepsOrder: writes delayed by random times arrive in order.
func TestDelayKeepsOrder(t *testing.T) {
	for seed := range int64(5) {
		n := memnet.New(seed)
		c, s := pair(t, n)
		n.Delay("a", "b", 0, 2*time.Millisecond)
		var want bytes.Buffer
		go func() {
			for i := range 200 {
				_, _ = c.Write([]byte{byte(i)})
			}
		}()
		for i := range 200 {
			want.WriteByte(byte(i))
		}
		got := make([]byte, 200)
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("seed %d: %v, out of order: %v", seed, err, got)
		}
	}
}
