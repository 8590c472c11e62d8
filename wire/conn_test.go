package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// waitBlocked waits until a goroutine whose stack holds fn (such as
// "wire.(*Conn).SendMessage(") is parked in a select, a channel operation
// or a lock: the moment a test that releases blocked callers needs, which
// nothing else reports.
func waitBlocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	poll.Until(t, fn+" blocked", func() bool {
		all := buf[:runtime.Stack(buf, true)]
		for _, g := range bytes.Split(all, []byte("\n\n")) {
			header, _, _ := bytes.Cut(g, []byte("\n"))
			parked := bytes.Contains(header, []byte("[select")) || bytes.Contains(header, []byte("[chan")) ||
				bytes.Contains(header, []byte("[sync")) || bytes.Contains(header, []byte("[IO wait"))
			if parked && bytes.Contains(g, []byte(fn)) {
				return true
			}
		}
		return false
	})
}

// countingConn counts Write calls on a net.Conn.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	return a, b
}

// closeRecorder records OnClose calls.
type closeRecorder struct {
	mu    sync.Mutex
	calls []error
	done  chan struct{}
}

func newCloseRecorder() *closeRecorder { return &closeRecorder{done: make(chan struct{})} }

func (r *closeRecorder) onClose(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, err)
	if len(r.calls) == 1 {
		close(r.done)
	}
}

func (r *closeRecorder) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("OnClose not called")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) != 1 {
		t.Fatalf("OnClose called %d times", len(r.calls))
	}
	return r.calls[0]
}

type received struct {
	kind   FrameType
	stream uint32
	seq    uint64
	data   []byte
}

func TestConnOrderingAndData(t *testing.T) { forBothWriteModes(t, testConnOrderingAndData) }

func testConnOrderingAndData(t *testing.T, direct bool) {
	a, b := tcpPair(t)
	const n = 2000
	big := bytes.Repeat([]byte{0xab}, 1<<20)
	var got []received
	all := make(chan struct{})
	cb := NewConn(b, Remote{Node: "a"}, ConnOptions{Handler: func(f Frame) {
		switch f := f.(type) {
		case *MessageFrame:
			got = append(got, received{kind: FrameMessage, stream: f.Stream, seq: f.Message.Request, data: f.Message.Body})
		}
		if len(got) == n+n/100 {
			close(all)
		}
	}})
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{DirectWrite: direct})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)

	ctx := context.Background()
	for i := range n {
		if err := ca.Send(ctx, FrameMessage, 0, uint32(i), &Message{Target: "x", Request: uint64(i)}); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			p := big
			if i%200 == 0 {
				p = big[:100]
			}
			if err := ca.Send(ctx, FrameMessage, 0, uint32(i), &Message{Target: "big", Request: uint64(i), Body: p}); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("received %d of %d frames", len(got), n+n/100)
	}
	k := 0
	for i := range n {
		if r := got[k]; r.kind != FrameMessage || r.seq != uint64(i) || r.stream != uint32(i) || len(r.data) != 0 {
			t.Fatalf("frame %d: %+v, want message %d", k, r, i)
		}
		k++
		if i%100 == 0 {
			r := got[k]
			want := big
			if i%200 == 0 {
				want = big[:100]
			}
			if r.kind != FrameMessage || r.seq != uint64(i) || !bytes.Equal(r.data, want) {
				t.Fatalf("frame %d: message %d with %d bytes, want %d", k, r.seq, len(r.data), len(want))
			}
			k++
		}
	}
}

func TestConnBatchesWrites(t *testing.T) {
	a, b := net.Pipe()
	cc := &countingConn{Conn: a}
	c := NewConn(cc, Remote{Node: "b"}, ConnOptions{})
	const n = 1000
	ctx := context.Background()
	for i := range n { // queued before the writer starts
		if err := c.Send(ctx, FrameMessage, 0, 1, &Message{Target: "actor", Type: "T", Body: []byte("0123456789"), Request: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	readDone := make(chan error, 1)
	go func() {
		fr := NewFramer(nil, b)
		for i := range n {
			f, err := fr.ReadFrame()
			if err != nil {
				readDone <- err
				return
			}
			if m := f.(*MessageFrame); m.Message.Request != uint64(i) {
				readDone <- errors.New("out of order")
				return
			}
		}
		readDone <- nil
	}()
	c.Start()
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	c.Close(nil)
	b.Close()
	w := cc.writes.Load()
	t.Logf("%d frames in %d writes", n, w)
	if w > n/50 {
		t.Fatalf("%d frames took %d writes; want batching", n, w)
	}
}

func TestConnBackpressure(t *testing.T) {
	a, b := net.Pipe() // nobody reads b: the writer blocks
	defer b.Close()
	const queue = 8
	c := NewConn(a, Remote{Node: "slow"}, ConnOptions{SendQueue: queue})
	c.Start()
	body := &Message{Body: make([]byte, 1000)}
	accepted := 0
	var err error
	for range 10000 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err = c.Send(ctx, FrameMessage, 0, 1, body)
		cancel()
		if err != nil {
			break
		}
		accepted++
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %d sends: %v, want context.DeadlineExceeded", accepted, err)
	}
	// The queue plus what the blocked writer holds in its 64 KiB buffer.
	if limit := queue + connBufferSize/1000 + 4; accepted > limit {
		t.Fatalf("%d sends accepted by a stalled connection, want at most %d", accepted, limit)
	}
	if len(c.queue) > queue {
		t.Fatalf("queue holds %d frames", len(c.queue))
	}
	// Closing unblocks the writer and every sender.
	blocked := make(chan error, 1)
	go func() { blocked <- c.Send(context.Background(), FrameMessage, 0, 1, body) }()
	waitBlocked(t, "wire.(*Conn).Send(")
	c.Close(nil)
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Send after Close: %v", err)
	}
}

// TestConnFlushCancelledWhileQueued: a Flush whose ctx ends while the
// writer is stalled returns ctx's error, and the Conn goes on writing.
func TestConnFlushCancelledWhileQueued(t *testing.T) {
	a, b := net.Pipe()
	c := NewConn(a, Remote{Node: "slow"}, ConnOptions{SendQueue: 4})
	c.Start()
	defer c.Close(nil)
	ctx := context.Background()
	// Stall the writer: a frame larger than the pipe will take while nobody
	// reads.
	if err := c.Send(ctx, FrameMessage, 0, 1, &Message{Request: 1, Body: make([]byte, 100<<10)}); err != nil {
		t.Fatal(err)
	}
	waitBlocked(t, "net.(*pipe).write(") // the writer holds the large frame
	tctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	err := c.Flush(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush: %v", err)
	}
	// Now read everything: the cancelled flush marker is skipped.
	flushed := make(chan error, 1)
	go func() {
		if err := c.Send(ctx, FrameMessage, 0, 1, &Message{Request: 2}); err != nil {
			flushed <- err
			return
		}
		flushed <- c.Flush(ctx)
	}()
	fr := NewFramer(nil, b)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := f.(*MessageFrame); ok && m.Message.Request == 2 {
			break
		}
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	b.Close()
}

func TestConnCloseSemantics(t *testing.T) { forBothWriteModes(t, testConnCloseSemantics) }

func testConnCloseSemantics(t *testing.T, direct bool) {
	a, b := tcpPair(t)
	ra, rb := newCloseRecorder(), newCloseRecorder()
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{OnClose: ra.onClose, DirectWrite: direct})
	cb := NewConn(b, Remote{Node: "a"}, ConnOptions{OnClose: rb.onClose})
	ca.Start()
	cb.Start()
	if ca.Err() != nil {
		t.Fatal("Err before close")
	}
	cause := errors.New("test: shutting down")
	if err := ca.Close(cause); err != nil {
		t.Fatal(err)
	}
	if err := ca.Close(errors.New("second")); err != nil {
		t.Fatal(err)
	}
	if got := ra.wait(t); got != cause {
		t.Fatalf("OnClose got %v, want the cause", got)
	}
	if ca.Err() != cause {
		t.Fatalf("Err() = %v", ca.Err())
	}
	select {
	case <-ca.Done():
	default:
		t.Fatal("Done not closed")
	}
	ctx := context.Background()
	if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{}); !errors.Is(err, ErrClosed) || !errors.Is(err, cause) {
		t.Fatalf("Send after Close: %v", err)
	}
	if err := ca.Flush(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}
	// The peer sees the connection end.
	if err := rb.wait(t); !errors.Is(err, io.EOF) {
		t.Fatalf("peer's OnClose: %v", err)
	}
	cb.Close(nil)
	if ca.Remote().Node != "b" {
		t.Fatal("Remote()")
	}
}

func TestConnCloseBeforeStart(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	r := newCloseRecorder()
	c := NewConn(a, Remote{}, ConnOptions{OnClose: r.onClose})
	c.Close(nil)
	if err := r.wait(t); !errors.Is(err, ErrClosed) {
		t.Fatalf("OnClose: %v", err)
	}
	c.Start() // no effect on a closed Conn
	if err := c.Send(context.Background(), FramePing, 0, 0, &Ping{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send: %v", err)
	}
}

func TestConnGracefulGoAway(t *testing.T) { forBothWriteModes(t, testConnGracefulGoAway) }

func testConnGracefulGoAway(t *testing.T, direct bool) {
	a, b := tcpPair(t)
	rb := newCloseRecorder()
	var last uint64
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{DirectWrite: direct})
	cb := NewConn(b, Remote{Node: "a"}, ConnOptions{OnClose: rb.onClose, Handler: func(f Frame) {
		if m, ok := f.(*MessageFrame); ok {
			last = m.Message.Request
		}
	}})
	ca.Start()
	cb.Start()
	ctx := context.Background()
	for i := range 100 {
		ca.Send(ctx, FrameMessage, 0, 0, &Message{Request: uint64(i + 1)})
	}
	ca.Send(ctx, FrameGoAway, 0, 0, &GoAway{Code: CodeShutdown, Reason: "bye"})
	if err := ca.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ca.Close(nil)
	err := rb.wait(t)
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Code != CodeShutdown || !errors.Is(err, ErrClosed) {
		t.Fatalf("peer's OnClose: %v", err)
	}
	cb.Close(nil)
	if last != 100 {
		t.Fatalf("last message received %d, want 100: Flush lost frames", last)
	}
}

func TestConnReaderProtocolErrors(t *testing.T) {
	tests := []struct {
		name  string
		write func(fr *Framer)
		want  error
	}{
		{"handshake frame", func(fr *Framer) { fr.WriteHello(&Hello{Version: 1}) }, nil},
		{"reserved bits", func(fr *Framer) { fr.w.Write(unhex(t, "00000000 07 00 0100 00000000")) }, ErrBadHeader},
		{"too large", func(fr *Framer) { fr.w.Write(unhex(t, "7fffffff 0c 00 0000 00000001")) }, ErrFrameTooLarge},
		{"bad body", func(fr *Framer) { fr.WriteFrame(FrameMessage, 0, 1, unhex(t, "81 a162 c6ffffffff")) }, ErrBadBody},
		{"bad batch", func(fr *Framer) { fr.WriteFrame(FrameMessages, 0, 0, unhex(t, "92 80 81a162c6ffffffff")) }, ErrBadBody},
		{"batch of non-messages", func(fr *Framer) { fr.WriteFrame(FrameMessages, 0, 0, unhex(t, "92 80 01")) }, ErrBadBody},
		{"truncated", func(fr *Framer) { fr.w.Write(unhex(t, hdr(10, FramePing, 0, 0)+"81")); fr.w.(net.Conn).Close() }, ErrShortFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			defer a.Close()
			core, logs := observer.New(zapcore.WarnLevel)
			r := newCloseRecorder()
			c := NewConn(b, Remote{Node: "bad-peer"}, ConnOptions{Logger: zap.New(core), OnClose: r.onClose})
			c.Start()
			defer c.Close(nil)
			tc.write(NewFramer(a, nil))
			err := r.wait(t)
			var ce *ConnError
			if !errors.As(err, &ce) {
				t.Fatalf("cause %v is not a ConnError", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("cause %v does not wrap %v", err, tc.want)
			}
			entries := logs.All()
			if len(entries) != 1 || entries[0].ContextMap()["peer"] != "bad-peer" {
				t.Fatalf("log entries %+v", entries)
			}
		})
	}
}

func TestConnHandlerFailOnUnknownFrame(t *testing.T) {
	a, b := tcpPair(t)
	defer a.Close()
	r := newCloseRecorder()
	var c *Conn
	refuse := errors.New("test: unknown frame")
	c = NewConn(b, Remote{Node: "a"}, ConnOptions{OnClose: r.onClose, Handler: func(f Frame) {
		if u, ok := f.(*UnknownFrame); ok && bytes.Equal(u.Payload, []byte("?")) {
			c.Fail(refuse)
		}
	}})
	c.Start()
	NewFramer(a, nil).WriteFrame(77, 0, 0, []byte("?"))
	if err := r.wait(t); err != refuse {
		t.Fatalf("OnClose: %v", err)
	}
	c.Close(nil)
}

func TestConnSendErrors(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := NewConn(a, Remote{}, ConnOptions{MaxFrameSize: 100})
	defer c.Close(nil)
	ctx := context.Background()
	if err := c.Send(ctx, FrameMessage, 0, 0, &Message{Body: make([]byte, 100)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("large Send: %v", err)
	}
	if err := c.Send(ctx, FrameAuth, 0, 0, &Auth{}); err == nil {
		t.Fatal("Send of a handshake frame accepted")
	}
	if err := c.Send(ctx, FrameMessage, 0, 0, func() {}); err == nil {
		t.Fatal("Send of an unencodable body accepted")
	}
}

// TestConnReservedFrameIsUnknown: a frame of a reserved type (12, once
// DATA) reaches Handler as an *UnknownFrame.
func TestConnReservedFrameIsUnknown(t *testing.T) {
	a, b := tcpPair(t)
	got := make(chan *UnknownFrame, 1)
	cb := NewConn(b, Remote{}, ConnOptions{Handler: func(f Frame) {
		if u, ok := f.(*UnknownFrame); ok {
			got <- &UnknownFrame{FrameHeader: u.FrameHeader, Payload: bytes.Clone(u.Payload)}
		}
	}})
	cb.Start()
	defer cb.Close(nil)
	defer a.Close()
	if err := NewFramer(a, nil).WriteFrame(12, 0, 3, []byte("raw payload")); err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-got:
		if u.Type != 12 || u.Stream != 3 || string(u.Payload) != "raw payload" {
			t.Fatalf("got %v %q", u.FrameHeader, u.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("timeout")
	}
}

func TestConnConcurrentSenders(t *testing.T) { forBothWriteModes(t, testConnConcurrentSenders) }

func testConnConcurrentSenders(t *testing.T, direct bool) {
	a, b := tcpPair(t)
	const senders, each = 8, 500
	var mu sync.Mutex
	next := make([]uint64, senders)
	var bad atomic.Value
	all := make(chan struct{})
	count := 0
	cb := NewConn(b, Remote{}, ConnOptions{Handler: func(f Frame) {
		m := f.(*MessageFrame)
		s := m.Stream
		mu.Lock()
		defer mu.Unlock()
		if m.Message.Request != next[s] {
			bad.Store(fmt.Sprintf("sender %d: got %d, want %d", s, m.Message.Request, next[s]))
		}
		next[s]++
		count++
		if count == senders*each {
			close(all)
		}
	}})
	ca := NewConn(a, Remote{}, ConnOptions{SendQueue: 16, DirectWrite: direct})
	ca.Start()
	cb.Start()
	defer cb.Close(nil)
	defer ca.Close(nil)
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := ca.Send(context.Background(), FrameMessage, 0, uint32(s), &Message{Request: uint64(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("not all messages arrived")
	}
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
}

func forBothWriteModes(t *testing.T, test func(t *testing.T, direct bool)) {
	t.Run("queued", func(t *testing.T) { test(t, false) })
	t.Run("direct", func(t *testing.T) { test(t, true) })
}

func TestConnDirectWrite(t *testing.T) {
	a, b := net.Pipe()
	cc := &countingConn{Conn: a}
	c := NewConn(cc, Remote{}, ConnOptions{DirectWrite: true})
	ctx := context.Background()
	// Not started: frames are queued.
	if err := c.Send(ctx, FramePing, 0, 0, &Ping{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	fr := NewFramer(nil, b)
	c.Start()
	defer c.Close(nil)
	defer b.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		if seq > 1 {
			// Idle: written on this goroutine, so it returns only after the
			// peer read it (net.Pipe is synchronous): read concurrently.
			go func() { c.Send(ctx, FramePing, 0, 0, &Ping{Seq: seq}) }()
		}
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if p := f.(*PingFrame); p.Ping.Seq != seq {
			t.Fatalf("got ping %d, want %d", p.Ping.Seq, seq)
		}
	}
	if c.pending.Load() != 0 {
		t.Fatalf("pending = %d", c.pending.Load())
	}
}

// TestConnEndLogsNoWarning: a connection ended for an expected reason (End,
// Close) logs no warning; Fail does.
func TestConnEndLogsNoWarning(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(c *Conn, err error)
		warn bool
	}{
		{"End", func(c *Conn, err error) { c.End(err) }, false},
		{"Close", func(c *Conn, err error) { _ = c.Close(err) }, false},
		{"Fail", func(c *Conn, err error) { c.Fail(err) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			defer b.Close()
			core, logs := observer.New(zap.DebugLevel)
			c := NewConn(a, Remote{Node: "b"}, ConnOptions{Logger: zap.New(core)})
			tc.end(c, errors.New("peer goes away"))
			<-c.Done()
			if got := logs.FilterLevelExact(zap.WarnLevel).Len() > 0; got != tc.warn {
				t.Fatalf("warning logged: %v, want %v (%v)", got, tc.warn, logs.All())
			}
		})
	}
}
