package wire

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
)

// takeoverPair connects a plain Conn (ca, the sender) to one whose Handler
// is h and whose calls are taken over after d (cb); both close at the end
// of the test.
func takeoverPair(t *testing.T, d time.Duration, h func(c *Conn, f Frame)) (ca, cb *Conn) {
	t.Helper()
	a, b := tcpPair(t)
	var c *Conn
	cb = NewConn(b, Remote{Node: "a"}, ConnOptions{HandlerTakeover: d, Handler: func(f Frame) { h(c, f) }})
	c = cb
	ca = NewConn(a, Remote{Node: "b"}, ConnOptions{})
	ca.Start()
	cb.Start()
	t.Cleanup(func() {
		ca.Close(nil)
		cb.Close(nil)
	})
	return ca, cb
}

// TestConnHandlerTakeover: a Handler call that waits for a later frame
// would stall the connection for ever; with HandlerTakeover a new reader
// handles the later frame, which releases the first call.
func TestConnHandlerTakeover(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var order []uint64
	handled := make(chan struct{}, 3) // one per frame handled
	firstDone := make(chan struct{})
	ca, cb := takeoverPair(t, 2*time.Millisecond, func(c *Conn, f Frame) {
		m, ok := f.(*MessageFrame)
		if !ok {
			return
		}
		mu.Lock()
		order = append(order, m.Message.Request)
		mu.Unlock()
		handled <- struct{}{}
		switch m.Message.Request {
		case 1:
			c.MayBlock()
			<-release // blocks until frame 2 is handled
			close(firstDone)
		case 2:
			close(release)
		}
	})
	ctx := context.Background()
	for i := uint64(1); i <= 3; i++ {
		if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: i}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-firstDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked handler was never released: no take-over")
	}
	timeout := time.After(10 * time.Second)
	for range 3 {
		select {
		case <-handled:
		case <-timeout:
			t.Fatal("not every frame was handled")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 3 {
		t.Fatalf("frames handled in order %v, want [1 2 3]", order)
	}
	if got := cb.Takeovers(); got != 1 {
		t.Fatalf("Takeovers() = %d, want 1", got)
	}
}

// TestConnHandlerTakeoverSparesBatches: a FrameMessages batch aliases the
// reader's buffers, so a slow Handler call for one is never taken over;
// the next frame waits for it.
func TestConnHandlerTakeoverSparesBatches(t *testing.T) {
	release := make(chan struct{})
	handled := make(chan uint64, 16)
	ca, cb := takeoverPair(t, time.Millisecond, func(c *Conn, f Frame) {
		c.MayBlock() // ignored for a batch
		switch f := f.(type) {
		case *MessagesFrame:
			<-release
			handled <- f.Messages[0].Request
		case *MessageFrame:
			handled <- f.Message.Request
		}
	})
	ctx := context.Background()
	if err := ca.Send(ctx, FrameMessages, 0, 0, []Message{{Target: "x", Request: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-handled:
		t.Fatalf("frame %d handled while the batch's handler was blocked", r)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	for _, want := range []uint64{1, 2} {
		select {
		case r := <-handled:
			if r != want {
				t.Fatalf("handled %d, want %d", r, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("frame %d not handled", want)
		}
	}
	if got := cb.Takeovers(); got != 0 {
		t.Fatalf("Takeovers() = %d, want 0", got)
	}
}

// TestConnHandlerTakeoverCloseWhileBlocked: closing a Conn whose Handler
// is blocked returns once the reader was taken over, without waiting for
// Handler, and the watchdog stops with the last Conn.
func TestConnHandlerTakeoverCloseWhileBlocked(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	ca, cb := takeoverPair(t, time.Millisecond, func(c *Conn, f Frame) {
		if _, ok := f.(*MessageFrame); ok {
			c.MayBlock()
			close(entered)
			<-release
		}
	})
	if err := ca.Send(context.Background(), FrameMessage, 0, 0, &Message{Target: "x"}); err != nil {
		t.Fatal(err)
	}
	<-entered
	closed := make(chan struct{})
	go func() {
		cb.Close(nil)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the blocked handler")
	}
	close(release) // the abandoned goroutine ends (goleak checks it)
}

func BenchmarkConnHandlerGuard(b *testing.B) {
	c := &Conn{opts: ConnOptions{HandlerTakeover: time.Millisecond}}
	for b.Loop() {
		s := (c.rstate.Load()&^phaseMask + phaseMask + 1) | phaseHandling
		c.rstate.Store(s)
		takeoverWatch.poke()
		if !c.rstate.CompareAndSwap(s, s&^phaseMask) {
			b.Fatal("taken over")
		}
	}
}

// TestTakeoverWatchdogParksWhenIdle: with no Handler call in progress and
// none since its last tick, the watchdog stops ticking; the next guarded
// call wakes it, and a call that blocks is still taken over.
func TestTakeoverWatchdogParksWhenIdle(t *testing.T) {
	release := make(chan struct{})
	third := make(chan struct{})
	ca, cb := takeoverPair(t, 2*time.Millisecond, func(c *Conn, f Frame) {
		if m, ok := f.(*MessageFrame); ok {
			switch m.Message.Request {
			case 2:
				c.MayBlock()
				<-release
			case 3:
				close(third)
			}
		}
	})
	ctx := context.Background()
	if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: 1}); err != nil {
		t.Fatal(err)
	}
	// Nothing reports the parking but the flag.
	poll.Until(t, "the watchdog parked while idle", takeoverWatch.park.Parked)
	if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: 2}); err != nil {
		t.Fatal(err)
	}
	// Frame 3 is handled while the call for frame 2 blocks: only by a new
	// reader, after a take-over.
	if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: 3}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-third:
	case <-time.After(10 * time.Second):
		t.Fatal("a blocked call after parking was not taken over")
	}
	if cb.Takeovers() == 0 {
		t.Fatal("frame 3 handled without a take-over")
	}
	close(release)
}

// TestConnHandlerTakeoverNeedsMayBlock: a call that did not say it may
// block is waited for, however long it runs: the next frame must not be
// handled before the frame in the call took its place downstream.
func TestConnHandlerTakeoverNeedsMayBlock(t *testing.T) {
	release := make(chan struct{})
	handled := make(chan uint64, 4)
	ca, cb := takeoverPair(t, time.Millisecond, func(c *Conn, f Frame) {
		if m, ok := f.(*MessageFrame); ok {
			if m.Message.Request == 1 {
				<-release // slow, not marked: no take-over
			}
			handled <- m.Message.Request
		}
	})
	ctx := context.Background()
	for i := uint64(1); i <= 2; i++ {
		if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: i}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case r := <-handled:
		t.Fatalf("frame %d handled while the unmarked call for frame 1 ran", r)
	case <-time.After(20 * time.Millisecond): // many take-over periods
	}
	close(release)
	for _, want := range []uint64{1, 2} {
		if r := <-handled; r != want {
			t.Fatalf("handled %d, want %d", r, want)
		}
	}
	if got := cb.Takeovers(); got != 0 {
		t.Fatalf("Takeovers() = %d, want 0", got)
	}
}

// TestConnTransientMessages: with TransientMessages, single messages are
// read into one reused frame whose body aliases the read buffer; a call
// that is taken over keeps its frame and body intact while the reading
// goes on into new ones.
func TestConnTransientMessages(t *testing.T) {
	a, b := tcpPair(t)
	release := make(chan struct{})
	firstDone := make(chan error, 1)
	frames := make(chan *MessageFrame, 8) // the frame of each call after the first
	var first *MessageFrame
	var cb *Conn
	cb = NewConn(b, Remote{Node: "a"}, ConnOptions{HandlerTakeover: 2 * time.Millisecond, TransientMessages: true, Handler: func(f Frame) {
		m, ok := f.(*MessageFrame)
		if !ok {
			return
		}
		if m.Message.Request != 1 {
			frames <- m
			if m.Message.Request == 2 {
				close(release)
			}
			return
		}
		first = m
		cb.MayBlock()
		<-release // frame 2 is handled by a new reader meanwhile
		if got := string(m.Message.Body); m.Message.Request != 1 || got != "body 1" {
			firstDone <- fmt.Errorf("the taken-over call's frame changed under it: request %d, body %q", m.Message.Request, got)
			return
		}
		firstDone <- nil
	}})
	ca := NewConn(a, Remote{Node: "b"}, ConnOptions{})
	ca.Start()
	cb.Start()
	t.Cleanup(func() {
		ca.Close(nil)
		cb.Close(nil)
	})
	ctx := context.Background()
	for i := uint64(1); i <= 4; i++ {
		if err := ca.Send(ctx, FrameMessage, 0, 0, &Message{Target: "x", Request: i, Body: fmt.Appendf(nil, "body %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-firstDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked handler was never released: no take-over")
	}
	// Frames 3 and 4, read by the same reader after the take-over, share
	// one frame, which is not the taken-over call's.
	var got []*MessageFrame
	for range 3 {
		select {
		case m := <-frames:
			got = append(got, m)
		case <-time.After(10 * time.Second):
			t.Fatal("not every frame was handled")
		}
	}
	if got[0] == first {
		t.Fatal("the reading went on into the taken-over call's frame")
	}
	if got[1] != got[2] {
		t.Fatal("frames 3 and 4 were read into different frames: TransientMessages reuses none")
	}
	if got[2].Message.Request != 4 || string(got[2].Message.Body) != "body 4" {
		t.Fatalf("last frame: request %d, body %q", got[2].Message.Request, got[2].Message.Body)
	}
	if cb.Takeovers() == 0 {
		t.Fatal("no take-over counted")
	}
}
