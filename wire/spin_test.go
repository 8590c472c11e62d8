package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestSpinReaderOnlyForSockets(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if r := newSpinReader(a, time.Millisecond); r != nil {
		t.Error("a pipe got a spinning reader")
	}
	c, _ := tcpPair(t)
	if r := newSpinReader(c, 0); r != nil {
		t.Error("spin 0 got a spinning reader")
	}
	if r := newSpinReader(c, time.Millisecond); r == nil {
		t.Error("a TCP connection got no spinning reader")
	}
}

// Data written while the reader spins, and data written after it parked,
// both arrive; the peer's close reads as EOF.
func TestSpinReaderReadsWhileSpinningAndAfterParking(t *testing.T) {
	for _, spin := range []time.Duration{time.Hour, time.Nanosecond} {
		c, d := tcpPair(t)
		readsThenEOF(t, fmt.Sprint("spin ", spin), newSpinReader(c, spin), d, nil)
	}
}

// readsThenEOF checks that r reads what its peer d writes, and EOF once d
// has closed; between, if not nil, runs in between.
func readsThenEOF(t *testing.T, name string, r io.Reader, d net.Conn, between func()) {
	t.Helper()
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 16)
		n, err := r.Read(buf)
		got <- buf[:n]
		errc <- err
		_, err = r.Read(buf)
		errc <- err
	}()
	if _, err := d.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "hello" {
		t.Errorf("%s: read %q", name, b)
	}
	if err := <-errc; err != nil {
		t.Errorf("%s: %v", name, err)
	}
	if between != nil {
		between()
	}
	d.Close()
	if err := <-errc; err != io.EOF {
		t.Errorf("%s: after the peer closed: %v, want EOF", name, err)
	}
}

func TestSpinReaderHonoursReadDeadline(t *testing.T) {
	c, _ := tcpPair(t)
	r := newSpinReader(c, time.Nanosecond)
	if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := r.Read(make([]byte, 4))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read past the deadline: %v", err)
	}
}

// Frames flow both ways between two Conns whose readers spin.
func TestConnWithReadSpin(t *testing.T) {
	a, b := tcpPair(t)
	// The handler copies what it got: a batch's memory is the reader's.
	in := make(chan *Message, 4)
	opts := ConnOptions{ReadSpin: time.Millisecond, Handler: func(f Frame) {
		switch f := f.(type) {
		case *MessageFrame:
			in <- &f.Message
		case *MessagesFrame:
			for _, m := range f.Messages {
				in <- &Message{Target: m.Target, Body: bytes.Clone(m.Body)}
			}
		}
	}}
	ca := NewConn(a, Remote{Node: "b"}, opts)
	cb := NewConn(b, Remote{Node: "a"}, opts)
	ca.Start()
	cb.Start()
	defer ca.Close(nil)
	defer cb.Close(nil)
	for i := range 3 {
		from, to := ca, "b"
		if i%2 == 1 {
			from, to = cb, "a"
		}
		if err := from.SendMessage(t.Context(), &Message{Target: to, Type: "x", Body: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
		m := <-in
		if m == nil || m.Target != to || len(m.Body) != 1 || m.Body[0] != byte(i) {
			t.Errorf("frame %d: %+v", i, m)
		}
	}
}

// A goroutine that Handler makes runnable runs before the reader spins
// again: the spin never yields, and on a processor of its own the reader
// held it until the runtime preempted the spin (10 ms) — a protoactor
// future's caller, woken by its reply, waited that long.
func TestReadSpinLetsHandlersWokenGoroutineRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	a, b := tcpPair(t)
	kick := make(chan time.Time, 1)
	ran := make(chan time.Duration)
	go func() {
		for t0 := range kick {
			ran <- time.Since(t0)
		}
	}()
	defer close(kick)
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{})
	cb := NewConn(b, Remote{Node: "a"}, ConnOptions{ReadSpin: time.Hour, Handler: func(Frame) { kick <- time.Now() }})
	ca.Start()
	cb.Start()
	defer ca.Close(nil)
	defer cb.Close(nil)
	best := time.Hour
	for range 5 {
		if err := ca.SendMessage(t.Context(), &Message{Target: "x", Type: "x"}); err != nil {
			t.Fatal(err)
		}
		best = min(best, <-ran)
	}
	// Preemption ends a spin after 10 ms at the earliest.
	if best >= 5*time.Millisecond {
		t.Errorf("the goroutine Handler woke ran %v after it at best: the reader's spin held it", best)
	}
}
