package wire

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/internal/poll"
)

// echoClient is the calling end of a connection to an echo server: each
// request (a FrameMessage to "echo" with a request id) is answered with a
// FrameMessage to "reply" with the same id. The client's Handler hands each
// reply to its waiting call and counts who read it.
type echoClient struct {
	c, srv *Conn

	mu    sync.Mutex
	calls map[uint64]*echoCall
	notes []uint64 // unsolicited "note" frames, in arrival order

	byCaller, byReader atomic.Int64  // replies read by the waiting callers / the reader goroutine
	block              chan struct{} // a "block" note's Handler call waits on it
	asked              chan error    // an "ask" note's Handler call: its own request's result
}

type echoCall struct {
	w  Waiter
	ch chan uint64
}

// newEchoClient connects a client Conn (opts, its Handler set here) to an
// echo server over TCP loopback (or over nc and sc). The server leaves
// requests whose id ends in 999 unanswered.
func newEchoClient(t *testing.T, opts ConnOptions, nc net.Conn, sc net.Conn) *echoClient {
	t.Helper()
	e := &echoClient{calls: make(map[uint64]*echoCall), block: make(chan struct{}), asked: make(chan error, 4)}
	if nc == nil {
		nc, sc = tcpPair(t)
	}
	e.srv = NewConn(sc, Remote{Node: "client"}, ConnOptions{DirectWrite: true, Handler: func(f Frame) {
		m, ok := f.(*MessageFrame)
		if !ok || m.Message.Target != "echo" || m.Message.Request%1000 == 999 {
			return // ids ending in 999 go unanswered
		}
		_ = e.srv.Send(context.Background(), FrameMessage, 0, 0, &Message{Target: "reply", Request: m.Message.Request})
	}})
	opts.Handler = e.handle
	e.c = NewConn(nc, Remote{Node: "server"}, opts)
	e.srv.Start()
	e.c.Start()
	t.Cleanup(func() {
		e.c.Close(nil)
		e.srv.Close(nil)
	})
	return e
}

func (e *echoClient) handle(f Frame) {
	m, ok := f.(*MessageFrame)
	if !ok {
		return
	}
	switch m.Message.Target {
	case "reply":
		if e.c.lead != nil && e.c.lead.state.Load() == roleCaller {
			e.byCaller.Add(1)
		} else {
			e.byReader.Add(1)
		}
		e.mu.Lock()
		call := e.calls[m.Message.Request]
		delete(e.calls, m.Message.Request)
		e.mu.Unlock()
		if call != nil {
			k := call.w.Claim()
			call.ch <- m.Message.Request
			k.Notify()
		}
	case "note":
		e.mu.Lock()
		e.notes = append(e.notes, m.Message.Request)
		e.mu.Unlock()
	case "block":
		e.c.MayBlock()
		<-e.block
	case "ask":
		// A handler that asks the same peer and waits for the answer, as
		// an actor run inline may.
		e.c.MayBlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		e.asked <- e.request(ctx, m.Message.Request)
		cancel()
	case "ask-elsewhere":
		// The same, waiting by its own means, as a protoactor future
		// does: ExpectReply, not Await.
		e.c.MayBlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		e.asked <- e.requestElsewhere(ctx, m.Message.Request)
		cancel()
	}
}

// request sends request id and waits for its reply through Await, as
// actor.Node.Request does; it returns ctx's error if ctx ends first.
func (e *echoClient) request(ctx context.Context, id uint64) error {
	return e.ask(ctx, id, true)
}

// requestElsewhere is request waiting on the call's own channel after
// ExpectReply, without reading the connection, as a protoactor future
// waits.
func (e *echoClient) requestElsewhere(ctx context.Context, id uint64) error {
	return e.ask(ctx, id, false)
}

func (e *echoClient) ask(ctx context.Context, id uint64, await bool) error {
	call := &echoCall{ch: make(chan uint64, 1)}
	e.mu.Lock()
	e.calls[id] = call
	e.mu.Unlock()
	if err := e.c.Send(ctx, FrameMessage, 0, 0, &Message{Target: "echo", Request: id}); err != nil {
		return err
	}
	if await {
		e.c.Await(ctx, &call.w, func() bool { return len(call.ch) > 0 })
	} else {
		e.c.ExpectReply()
	}
	select {
	case got := <-call.ch:
		if got != id {
			return errors.New("reply to another request")
		}
		return nil
	case <-ctx.Done():
		e.mu.Lock()
		_, pending := e.calls[id]
		delete(e.calls, id)
		e.mu.Unlock()
		if !pending {
			<-call.ch // being delivered
		}
		call.w.Claim().Notify()
		return ctx.Err()
	}
}

func (e *echoClient) followers() int32 { return e.c.lead.followers.Load() }

// interruptiblePipe is a test double of an InterruptibleReader that is not
// a socket (as shm.Conn is): net.Pipe's Read ends, nothing read, when a read
// deadline passes.
type interruptiblePipe struct{ net.Conn }

func (interruptiblePipe) InterruptibleReads() {}

// readablePairs are the transports callers may read: a TCP socket and an
// InterruptibleReader.
var readablePairs = []struct {
	name string
	pair func(t *testing.T) (net.Conn, net.Conn)
}{
	{"tcp", tcpPair},
	{"interruptible", func(*testing.T) (net.Conn, net.Conn) {
		a, b := net.Pipe()
		return interruptiblePipe{a}, b
	}},
}

// overReadable runs test once per transport callers may read.
func overReadable(t *testing.T, test func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn))) {
	for _, r := range readablePairs {
		t.Run(r.name, func(t *testing.T) { test(t, r.pair) })
	}
}

// newEchoClientOver is newEchoClient over a pair of pair's.
func newEchoClientOver(t *testing.T, opts ConnOptions, pair func(*testing.T) (net.Conn, net.Conn)) *echoClient {
	nc, sc := pair(t)
	return newEchoClient(t, opts, nc, sc)
}

// TestAwaitCallerReadsItsReply: after the first round trip, a caller that
// waits for its reply reads it itself.
func TestAwaitCallerReadsItsReply(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{DirectWrite: true}, pair)
		ctx := context.Background()
		const n = 200
		for i := uint64(1); i <= n; i++ {
			if err := e.request(ctx, i); err != nil {
				t.Fatal(err)
			}
		}
		if caller := e.byCaller.Load(); caller < n/2 {
			t.Fatalf("%d of %d replies read by the waiting caller (%d by the reader goroutine), want most", caller, n, e.byReader.Load())
		}
		if f := e.followers(); f != 0 {
			t.Fatalf("%d followers left registered", f)
		}
	})
}

// TestAwaitCallerReadsOthersFrames: frames the peer sends while a caller
// leads (notes for the connection's Handler) are handled in order, and a
// note that comes after the callers stopped is read by the reader
// goroutine once the role has been free for CallerReads.
func TestAwaitCallerReadsOthersFrames(t *testing.T) {
	e := newEchoClient(t, ConnOptions{CallerReads: time.Millisecond}, nil, nil)
	ctx := context.Background()
	var sent uint64
	for i := uint64(1); i <= 100; i++ {
		if i%3 == 0 {
			sent++
			if err := e.srv.Send(ctx, FrameMessage, 0, 0, &Message{Target: "note", Request: sent}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.request(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	sent++
	if err := e.srv.Send(ctx, FrameMessage, 0, 0, &Message{Target: "note", Request: sent}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "every note handled", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return uint64(len(e.notes)) == sent
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, id := range e.notes {
		if id != uint64(i+1) {
			t.Fatalf("notes handled in order %v", e.notes)
		}
	}
}

// TestAwaitConcurrentCallers: callers on many goroutines each get their
// own reply, whoever reads it, and none is left waiting.
func TestAwaitConcurrentCallers(t *testing.T) {
	e := newEchoClient(t, ConnOptions{DirectWrite: true}, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const callers, each = 8, 100
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range each {
				if err := e.request(ctx, uint64(g*10000+i+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := e.byCaller.Load() + e.byReader.Load(); got != callers*each {
		t.Fatalf("%d replies handled, want %d", got, callers*each)
	}
	if f := e.followers(); f != 0 {
		t.Fatalf("%d followers left registered", f)
	}
}

// TestAwaitCtxEnds: a caller reading for a reply that never comes returns
// once its ctx ends, and the connection goes on serving the next callers.
func TestAwaitCtxEnds(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{}, pair)
		bg := context.Background()
		for i := uint64(1); i <= 5; i++ { // the caller reads from now on
			if err := e.request(bg, i); err != nil {
				t.Fatal(err)
			}
		}
		for _, cancelled := range []bool{false, true} {
			var ctx context.Context
			var cancel context.CancelFunc
			if cancelled {
				ctx, cancel = context.WithCancel(bg)
				time.AfterFunc(20*time.Millisecond, cancel)
			} else {
				ctx, cancel = context.WithTimeout(bg, 20*time.Millisecond)
			}
			start := time.Now()
			err := e.request(ctx, 999) // unanswered
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Fatalf("request without a reply: %v, want the ctx's error", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the caller returned %v after its ctx ended", d)
			}
			if err := e.request(bg, 6); err != nil {
				t.Fatal(err)
			}
		}
		if f := e.followers(); f != 0 {
			t.Fatalf("%d followers left registered", f)
		}
	})
}

// TestAwaitWokenByAnotherGoroutine: a leading caller whose result comes
// from another goroutine (Claim, result, Notify) stops reading at once.
func TestAwaitWokenByAnotherGoroutine(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{CallerReads: time.Minute}, pair)
		bg := context.Background()
		for i := uint64(1); i <= 5; i++ {
			if err := e.request(bg, i); err != nil {
				t.Fatal(err)
			}
		}
		var w Waiter
		done := make(chan struct{}, 1)
		go func() {
			for e.c.lead.state.Load() != roleCaller {
				time.Sleep(time.Millisecond)
			}
			k := w.Claim()
			done <- struct{}{}
			k.Notify()
		}()
		ctx, cancel := context.WithTimeout(bg, time.Minute)
		defer cancel()
		if follows := e.c.Await(ctx, &w, func() bool { return len(done) > 0 }); follows {
			t.Fatal("the caller did not read: the role was not free")
		}
		if len(done) == 0 {
			t.Fatal("Await returned before its result came")
		}
		if err := e.request(bg, 6); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAwaitCloseWhileReading: closing the connection under a caller
// blocked reading ends the caller's read and the Conn's goroutines.
func TestAwaitCloseWhileReading(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		// The role stays free after the last request until the caller
		// below takes it: with the default CallerReads (200 us) a caller
		// that starts later (a busy machine) finds the reader goroutine
		// back in its read and follows, and no frame comes to hand the
		// role over (it failed so in CI, 1 run in many).
		e := newEchoClientOver(t, ConnOptions{CallerReads: time.Minute}, pair)
		bg := context.Background()
		for i := uint64(1); i <= 5; i++ {
			if err := e.request(bg, i); err != nil {
				t.Fatal(err)
			}
		}
		ret := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(bg, time.Minute)
			defer cancel()
			call := &echoCall{ch: make(chan uint64, 1)}
			e.c.Await(ctx, &call.w, func() bool { return len(call.ch) > 0 })
			ret <- ctx.Err()
		}()
		poll.Until(t, "the caller reads", func() bool { return e.c.lead.state.Load() == roleCaller })
		e.c.Close(nil)
		select {
		case err := <-ret:
			if err != nil {
				t.Fatalf("Await returned by its ctx (%v), not by the close", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Await still reading after Close")
		}
	})
}

// TestAwaitFromABlockingHandler: a Handler call that has called MayBlock
// and then waits for a frame of the same connection (its own request) is
// taken over at once, not after HandlerTakeover (a minute here): the
// reading goes on elsewhere and reads its answer, whether the call ran on
// the reader goroutine or on a leading caller; that caller, its reading
// taken over, still gets its own reply.
func TestAwaitFromABlockingHandler(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{HandlerTakeover: time.Minute, CallerReads: time.Minute}, pair)
		bg := context.Background()
		ask := func(id uint64) {
			t.Helper()
			if err := e.srv.Send(bg, FrameMessage, 0, 0, &Message{Target: "ask", Request: id}); err != nil {
				t.Fatal(err)
			}
			if err := <-e.asked; err != nil {
				t.Fatalf("a handler's own request: %v", err)
			}
		}
		ask(1) // on the reader goroutine
		for i := uint64(2); i <= 6; i++ {
			if err := e.request(bg, i); err != nil {
				t.Fatal(err)
			}
		}
		// Now on a leading caller, waiting for a reply that comes after.
		ret := make(chan error, 1)
		go func() {
			// Its reading is taken over while its reply is still to
			// come: it must wait again, not for CallerReads (a minute).
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			ret <- e.request(ctx, 1999) // answered below
		}()
		poll.Until(t, "the caller reads", func() bool { return e.c.lead.state.Load() == roleCaller })
		ask(8)
		if err := e.srv.Send(bg, FrameMessage, 0, 0, &Message{Target: "reply", Request: 1999}); err != nil {
			t.Fatal(err)
		}
		if err := <-ret; err != nil {
			t.Fatal(err)
		}
		if n := e.c.Takeovers(); n != 2 {
			t.Fatalf("%d take-overs, want 2", n)
		}
		if err := e.request(bg, 9); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExpectReplyFromABlockingHandler: a Handler call that declared
// MayBlock and waits for the peer's reply by its own means (ExpectReply,
// then its own channel) gets it: the reading is taken over at once, not
// after HandlerTakeover (a minute here).
func TestExpectReplyFromABlockingHandler(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{HandlerTakeover: time.Minute, CallerReads: time.Minute}, pair)
		bg := context.Background()
		for i := uint64(1); i <= 3; i++ {
			if err := e.srv.Send(bg, FrameMessage, 0, 0, &Message{Target: "ask-elsewhere", Request: i}); err != nil {
				t.Fatal(err)
			}
			if err := <-e.asked; err != nil {
				t.Fatalf("a handler's own request: %v", err)
			}
		}
		if n := e.c.Takeovers(); n != 3 {
			t.Fatalf("%d take-overs, want 3", n)
		}
		if err := e.request(bg, 9); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAwaitTakeoverOfCaller: a Handler call that blocks on a leading
// caller's goroutine is taken over like the reader goroutine's: the reader
// goroutine goes on reading, and the caller stops reading when the call
// returns.
func TestAwaitTakeoverOfCaller(t *testing.T) {
	e := newEchoClient(t, ConnOptions{HandlerTakeover: 2 * time.Millisecond, CallerReads: time.Minute}, nil, nil)
	bg := context.Background()
	for i := uint64(1); i <= 5; i++ {
		if err := e.request(bg, i); err != nil {
			t.Fatal(err)
		}
	}
	ret := make(chan error, 1)
	go func() { ret <- e.request(bg, 1999) }() // answered below
	poll.Until(t, "the caller reads", func() bool { return e.c.lead.state.Load() == roleCaller })
	// The caller handles the block note and blocks in it; the note and
	// the reply after it are read by the reader goroutine.
	for _, m := range []*Message{{Target: "block"}, {Target: "note", Request: 1}, {Target: "reply", Request: 1999}} {
		if err := e.srv.Send(bg, FrameMessage, 0, 0, m); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "the note and the reply after the blocked call handled", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.notes) == 1 && len(e.calls) == 0
	})
	if got := e.c.Takeovers(); got != 1 {
		t.Fatalf("Takeovers() = %d, want 1", got)
	}
	close(e.block)
	select {
	case err := <-ret:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller whose Handler call was taken over never returned")
	}
	if err := e.request(bg, 7); err != nil {
		t.Fatal(err)
	}
}

// TestAwaitNeedsASocket: a connection that is neither a socket nor an
// InterruptibleReader (or one with CallerReads off) is never read by
// callers.
func TestAwaitNeedsASocket(t *testing.T) {
	a, b := net.Pipe()
	e := newEchoClient(t, ConnOptions{}, a, b)
	if e.c.lead != nil {
		t.Fatal("a pipe can be read by callers")
	}
	if err := e.request(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	off := newEchoClient(t, ConnOptions{CallerReads: -1}, nil, nil)
	if off.c.lead != nil {
		t.Fatal("CallerReads < 0 left callers reading")
	}
	var w Waiter
	if !off.c.Await(context.Background(), &w, func() bool { return false }) {
		t.Fatal("Await read a connection callers cannot read")
	}
	if k := w.Claim(); k.state != waiterIdle || k.c != nil {
		t.Fatal("Await registered a wait it does not serve")
	}
}

// TestAwaitStress: callers on several goroutines, some with deadlines that
// expire (unanswered requests), while the peer streams notes, then the
// connection closes under them: every caller returns, every note before
// the close is handled in order, and nothing is left registered.
func TestAwaitStress(t *testing.T) {
	overReadable(t, func(t *testing.T, pair func(*testing.T) (net.Conn, net.Conn)) {
		e := newEchoClientOver(t, ConnOptions{DirectWrite: true, CallerReads: 100 * time.Microsecond}, pair)
		bg := context.Background()
		stop := make(chan struct{})
		var notes sync.WaitGroup
		notes.Go(func() {
			for i := uint64(1); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := e.srv.Send(bg, FrameMessage, 0, 0, &Message{Target: "note", Request: i}); err != nil {
					return
				}
				time.Sleep(50 * time.Microsecond)
			}
		})
		var callers sync.WaitGroup
		for g := range 6 {
			callers.Go(func() {
				for i := range 150 {
					id := uint64(g*100000 + i + 1)
					if i%25 == 0 {
						id = uint64(g*100000+i)*1000 + 999 // unanswered
					}
					ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
					err := e.request(ctx, id)
					cancel()
					if err != nil && id%1000 != 999 && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("request %d: %v", id, err)
						return
					}
				}
			})
		}
		callers.Wait()
		close(stop)
		notes.Wait()
		if f := e.followers(); f != 0 {
			t.Fatalf("%d followers left registered", f)
		}
		// Callers waiting in Await when the connection closes (one reading,
		// the others following) return.
		ret := make(chan struct{}, 4)
		var waiting atomic.Int32
		for range 4 {
			go func() {
				ctx, cancel := context.WithTimeout(bg, time.Minute)
				defer cancel()
				var w Waiter
				waiting.Add(1)
				e.c.Await(ctx, &w, func() bool { return false })
				ret <- struct{}{}
			}()
		}
		poll.Until(t, "the callers wait", func() bool {
			// One reads and three follow, or, when the reader goroutine is
			// parked in a read (nothing came since the last note), four follow.
			f, st := e.followers(), e.c.lead.state.Load()
			return waiting.Load() == 4 && (f == 3 && st == roleCaller || f == 4 && st == roleReader)
		})
		e.c.Close(nil)
		for range 4 {
			select {
			case <-ret:
			case <-time.After(10 * time.Second):
				t.Fatal("a caller still waits after Close")
			}
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for i, id := range e.notes {
			if id != uint64(i+1) {
				t.Fatalf("note %d handled as the %dth", id, i+1)
			}
		}
	})
}
