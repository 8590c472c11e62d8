package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorferry/tensorferry/internal/park"
)

// The caller reads its own reply (Conn.Await).
//
// A connection has one read role: the goroutine holding it reads frames
// and passes them to Handler; nobody else touches the read side. The
// reader goroutine holds it from the start. A caller that waits for a
// frame from the peer (a request's reply) may take the role when it is
// free and read the connection itself until its frame has come: the
// runtime's network poller then wakes the caller, not the reader
// goroutine that would hand the reply over (a thread wake-up and a
// scheduler hand-off saved per round trip; one thread instead of two
// woken on a many-core host).
//
// The role becomes free when the reader goroutine, with nothing buffered,
// finds that a caller could not take it since it last looked (missed), and
// no caller still waits for a frame the reader would have to read
// (followers). A caller that has read its frame gives the role back: to the
// reader goroutine at once when others wait, or when bytes are buffered;
// otherwise it leaves the role free for the next caller, and the reader
// goroutine takes it back after ConnOptions.CallerReads unless a caller took
// it first. Request/response traffic from one caller thus reads on the
// caller's goroutine after its first round trip, while frames that come
// when nobody waits are read by the reader goroutine as before.
//
// Only a connection whose read a past read deadline interrupts without
// losing anything can be read by a caller: a wake-up (ctx ended, the frame
// delivered by another goroutine) interrupts the caller's read at a frame
// boundary through a read deadline. A socket (TCP, Unix) is one; so is a
// net.Conn that says so with InterruptibleReads (shm's rings, memnet's
// connections, a detached TCP connection). TLS is not:
// a deadline in the middle of a record breaks the connection.

// DefaultCallerReads is how long a connection's read role, left free by a
// caller that read its reply, waits for the next caller before the reader
// goroutine takes it back (ConnOptions.CallerReads): frames that arrive
// meanwhile wait up to that long.
const DefaultCallerReads = 200 * time.Microsecond

// Holders of the read role (lead.state).
const (
	roleReader  int32 = iota // the reader goroutine
	roleCaller               // a caller in Await
	roleFree                 // nobody: the reader goroutine waits for it
	roleOffered              // its token is in lead.offer for a follower
)

// lead is a Conn's read role; nil when callers cannot read.
type lead struct {
	linger time.Duration

	state     atomic.Int32
	missed    atomic.Bool   // a caller found the role taken
	followers atomic.Int32  // callers registered as followers, not yet done
	give      chan struct{} // the role handed to the reader goroutine
	// offer holds the role's token while it is offered to the followers
	// (roleOffered): the one that receives it reads.
	offer chan struct{}
	// The reader goroutine takes a free role back when it has been free
	// for linger: timer wakes it, armed by the first release after it
	// fired (not per release: resetting a timer can cost a wake-up of the
	// thread in the poller); freedAt is when the role was last freed
	// (nanoseconds since start).
	timer   *time.Timer
	armed   atomic.Bool
	freedAt atomic.Int64
	start   time.Time

	// boundary: the holder of the role is a caller about to read the
	// first bytes of a frame (only the holder touches it).
	boundary bool

	// mu orders a wake-up against the leading caller's read.
	mu       sync.Mutex
	waiting  bool // the leading caller reads at a frame boundary
	woken    bool // the leading caller is to check whether it is done
	deadline bool // a read deadline interrupts that read
	// ctx is the leading caller's: the reader goroutine, woken by timer
	// every linger while a caller leads, wakes the caller once it has
	// ended (so a caller notices within linger; watching each caller's
	// ctx would cost more than the round trip saves).
	ctx context.Context
}

// InterruptibleReader is a net.Conn that is not a socket but whose Read,
// waiting for bytes, a read deadline set in the past from another goroutine
// ends with os.ErrDeadlineExceeded and nothing read or lost (shm.Conn,
// internal/memnet's Conn): callers may then read it (Conn.Await).
type InterruptibleReader interface {
	net.Conn
	InterruptibleReads()
}

// callersMayRead reports whether nc's reads can be interrupted at a frame
// boundary by a read deadline: a socket, or an InterruptibleReader.
func callersMayRead(nc net.Conn) bool {
	if _, ok := nc.(InterruptibleReader); ok {
		return true
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	_, err := sc.SyscallConn()
	return err == nil
}

// newLead returns the read role of nc, or nil when callers cannot read nc
// or opts turn it off.
func newLead(nc net.Conn, opts ConnOptions) *lead {
	if opts.CallerReads < 0 || opts.Handler == nil || !callersMayRead(nc) {
		return nil
	}
	linger := opts.CallerReads
	if linger == 0 {
		linger = DefaultCallerReads
	}
	l := &lead{linger: linger, give: make(chan struct{}, 1), offer: make(chan struct{}, 1), timer: time.NewTimer(time.Hour), start: time.Now()}
	l.timer.Stop()
	return l
}

// Waiter is one caller's wait through Conn.Await. Its zero value is ready
// to use; it serves one wait at a time and may be reused once the wait
// has ended.
type Waiter struct {
	c     *Conn
	state atomic.Uint32 // waiterIdle, waiterLeading, waiterFollowing
	wake  chan struct{} // a follower's wake-up (made by its first Await)
}

const (
	waiterIdle uint32 = iota
	waiterLeading
	waiterFollowing
)

// Wakeup is what Waiter.Claim took: Notify it once the caller's result is
// where its ready function looks.
type Wakeup struct {
	c     *Conn
	wake  chan struct{}
	state uint32
}

// Claim ends w's wait and returns what must be notified. Whoever completes
// the wait from another goroutine (the one that hands over the reply)
// claims it, then makes the result visible, then calls Notify: Claim first
// because w may be reused as soon as the result is visible. Only the first
// Claim of a wait gets anything to notify.
func (w *Waiter) Claim() Wakeup {
	s := w.state.Swap(waiterIdle)
	if s == waiterIdle {
		return Wakeup{}
	}
	return Wakeup{c: w.c, wake: w.wake, state: s}
}

// Notify wakes the caller: if it reads the connection, so that it checks
// its ready function again; if it waits as a follower, so that it returns.
func (k Wakeup) Notify() {
	switch k.state {
	case waiterLeading:
		k.c.wakeLeader()
	case waiterFollowing:
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
}

// Await waits until ready reports true, ctx ends or the connection closes,
// reading the connection on the calling goroutine while it waits whenever
// the read role is free or offered to it: it then reads frames and passes
// them to Handler, as the reader goroutine would, checking ready before
// each frame. While another goroutine reads, the caller waits as a
// follower. Whoever makes ready true from another goroutine must Claim w
// first and Notify after. Await returns true at once, with nothing
// registered, on a connection that callers cannot read (the caller then
// waits its own way); otherwise false, after which ready is still false
// only when ctx ended or the connection closed. A Handler call on the
// caller's goroutine that is taken over (it ran past HandlerTakeover, or
// it waits for a frame itself) ends the caller's reading: the reading goes
// on elsewhere, and the caller waits again.
//
// The calling goroutine runs Handler for every frame it reads, its own and
// others' (an actor's handler run on the reader by inline delivery
// included). A Handler call may
// itself call Await on the same connection once it has called MayBlock: a
// caller that finds the read role held by a Handler call that may block
// takes that call over at once (the reading goes on elsewhere, as after
// HandlerTakeover). Without MayBlock (or without HandlerTakeover, which
// guards the calls) nothing takes the call over, and it waits until its
// ctx ends.
func (c *Conn) Await(ctx context.Context, w *Waiter, ready func() bool) bool {
	l := c.lead
	if l == nil {
		return true
	}
	w.c = c
	for {
		c.await(ctx, w, ready)
		// A Handler call on the caller's goroutine that was taken over
		// ends its reading, its frame perhaps still to come: it waits
		// again (the reader goroutine, finding no caller registered,
		// could leave the role free for CallerReads).
		if ready() || ctx.Err() != nil || c.isClosing() {
			return false
		}
	}
}

// await is one wait of Await: as the leading caller, or as a follower
// until its frame came, it was offered the role, or the reading it led
// was taken over.
func (c *Conn) await(ctx context.Context, w *Waiter, ready func() bool) {
	l := c.lead
	if l.state.CompareAndSwap(roleFree, roleCaller) {
		w.state.Store(waiterLeading)
		c.leadRead(ctx, ready)
		w.state.CompareAndSwap(waiterLeading, waiterIdle)
		return
	}
	// The role is held. If its holder is in a Handler call that may block
	// (MayBlock), that call may be waiting for this very caller's frame (a
	// handler's own request to the same peer): the reading moves on now,
	// not after HandlerTakeover.
	c.takeOverBlocked()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	select { // a wake-up left over from an earlier wait
	case <-w.wake:
	default:
	}
	w.state.Store(waiterFollowing)
	l.followers.Add(1)
	if l.state.CompareAndSwap(roleFree, roleCaller) {
		c.leadFollower(ctx, w, ready)
		return
	}
	// The reader goroutine leaves the role to the callers at its next
	// pause (keepRole).
	l.missed.Store(true)
	for !ready() {
		select {
		case <-l.offer:
			l.state.Store(roleCaller)
			c.leadFollower(ctx, w, ready)
			return
		case <-w.wake:
			continue
		case <-ctx.Done():
		case <-c.done:
		}
		break
	}
	l.followers.Add(-1)
	w.state.CompareAndSwap(waiterFollowing, waiterIdle)
}

// leadFollower: a follower holds the read role. It stops following and
// reads, unless its wait was claimed meanwhile (its result is on its way,
// and the Notify goes to its wake-up): then it gives the role on and waits
// for that.
func (c *Conn) leadFollower(ctx context.Context, w *Waiter, ready func() bool) {
	l := c.lead
	l.followers.Add(-1)
	if w.state.CompareAndSwap(waiterFollowing, waiterLeading) {
		c.leadRead(ctx, ready)
		w.state.CompareAndSwap(waiterLeading, waiterIdle)
		return
	}
	c.releaseRole()
	select {
	case <-w.wake:
	case <-ctx.Done():
	case <-c.done:
	}
}

// errWoken: the leading caller's read at a frame boundary was interrupted
// by a wake-up (nothing of the frame read).
var errWoken = errors.New("wire: woken")

// leadRead reads and handles frames on the caller's goroutine, which holds
// the read role, until ready or ctx ends, then gives the role back.
func (c *Conn) leadRead(ctx context.Context, ready func() bool) {
	l := c.lead
	l.mu.Lock()
	l.woken = false
	// The reader goroutine wakes the caller when ctx ends. It asks ctx.Err
	// (nil for ever from a ctx that cannot end); ctx.Done here would make
	// the channel of a context that has none yet, one per request.
	l.ctx = ctx
	l.mu.Unlock()
	if !l.armed.Swap(true) {
		l.timer.Reset(l.linger)
	}
	defer func() {
		l.mu.Lock()
		l.ctx = nil
		l.mu.Unlock()
	}()
	for !ready() && ctx.Err() == nil {
		// The first read of a frame, with nothing buffered, is where a
		// wake-up may interrupt the caller (nothing of the frame is read
		// yet); inside a frame it reads on until the frame is whole.
		l.boundary = c.br.Buffered() == 0
		f, err := c.rd.ReadFrame()
		l.boundary = false
		if err == errWoken {
			continue
		}
		if err != nil {
			c.fail(c.readError(err))
			break
		}
		switch c.handleFrame(f) {
		case frameFatal:
			c.releaseRole()
			return
		case frameTakenOver:
			return // the watchdog gave the role to the reader goroutine
		}
	}
	c.releaseRole()
}

// leadSource is what a Conn's buffered reader reads when callers may read
// (c.lead set): the socket (through the read spin, if any), and for a
// leading caller's first read of a frame a read that a wake-up interrupts.
type leadSource struct {
	c *Conn
	r io.Reader
}

func (s *leadSource) Read(p []byte) (int, error) {
	l := s.c.lead
	if !l.boundary {
		return s.r.Read(p)
	}
	l.boundary = false
	l.mu.Lock()
	if l.woken {
		l.woken = false
		l.mu.Unlock()
		return 0, errWoken
	}
	l.waiting = true
	l.mu.Unlock()
	n, err := s.r.Read(p)
	l.mu.Lock()
	l.waiting = false
	if l.deadline {
		l.deadline = false
		_ = s.c.nc.SetReadDeadline(time.Time{})
	}
	woken := l.woken
	l.woken = false
	l.mu.Unlock()
	if n == 0 && woken && (err == nil || errors.Is(err, os.ErrDeadlineExceeded)) {
		return 0, errWoken
	}
	return n, err
}

// wakeLeader interrupts the leading caller's wait for a frame, if any, so
// that it checks whether it is done. A wake-up meant for a caller that has
// left reaches the next one, which only checks again.
func (c *Conn) wakeLeader() {
	l := c.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	l.woken = true
	if l.waiting && !l.deadline {
		l.deadline = true
		_ = c.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// releaseRole gives the read role back after a caller has read: to the
// reader goroutine when bytes are buffered or the Conn is closing, to the
// followers when some wait; otherwise it is left free for the next caller
// until the linger passes.
func (c *Conn) releaseRole() {
	l := c.lead
	hand := c.br.Buffered() > 0
	l.freedAt.Store(int64(time.Since(l.start)))
	if hand || c.isClosing() {
		l.state.Store(roleFree)
		c.giveRole()
		return
	}
	if l.followers.Load() > 0 {
		c.offerRole()
		return
	}
	// Published: the followers' load must not pass it (a caller counts
	// itself, then tries to take the role; see package park).
	park.Publish32(&l.state, roleFree)
	if l.followers.Load() > 0 && l.state.CompareAndSwap(roleFree, roleCaller) {
		c.offerRole() // a caller became a follower meanwhile
		return
	}
	if !l.armed.Swap(true) {
		l.timer.Reset(l.linger)
	}
}

// offerRole offers the read role, held by the calling goroutine, to the
// followers; the reader goroutine takes it back if none has taken it
// within the linger.
func (c *Conn) offerRole() {
	l := c.lead
	l.state.Store(roleOffered)
	l.offer <- struct{}{} // never blocks: one token
	if !l.armed.Swap(true) {
		l.timer.Reset(l.linger)
	}
}

// giveRole hands a free read role to the reader goroutine.
func (c *Conn) giveRole() {
	l := c.lead
	if l.state.CompareAndSwap(roleFree, roleReader) {
		l.give <- struct{}{} // never blocks: one hand-over per free role
	}
}

// takenOverLeader is a take-over (takeOver) of a caller's Handler call:
// the reader goroutine goes on reading. It reports false when the call
// was the reader goroutine's own (a new reader must start).
func (c *Conn) takenOverLeader() bool {
	l := c.lead
	if l == nil || !l.state.CompareAndSwap(roleCaller, roleReader) {
		return false
	}
	l.give <- struct{}{}
	return true
}

// takeOverBlocked takes over the Handler call in progress, as the
// watchdog does after HandlerTakeover, when it has declared that it may
// block (MayBlock).
func (c *Conn) takeOverBlocked() {
	if s := c.rstate.Load(); s&phaseMask == phaseBlocking {
		c.takeOver(s)
	}
}

// takeOver abandons the Handler call that rstate s marks, if it is still
// the one in progress, and reports whether it did: the reading goes on in
// a new goroutine (or the reader goroutine, when a leading caller is the
// one in Handler).
func (c *Conn) takeOver(s uint64) bool {
	if !c.rstate.CompareAndSwap(s, s&^phaseMask|phaseAbandoned) {
		return false
	}
	// The abandoned call keeps its frame and the buffer its body aliases
	// (TransientMessages): the reading goes on into new ones.
	c.rd.disown()
	c.takeovers.Add(1)
	if !c.takenOverLeader() {
		go c.readLoop()
	}
	return true
}

// watchLeader is the reader goroutine's look at the leading caller, every
// linger: it wakes the caller if its ctx has ended, and arms the timer
// for the next look.
func (c *Conn) watchLeader() {
	l := c.lead
	l.mu.Lock()
	ctx := l.ctx
	l.mu.Unlock()
	if ctx != nil && ctx.Err() != nil {
		c.wakeLeader()
	}
	if !l.armed.Swap(true) {
		l.timer.Reset(l.linger)
	}
}

// isClosing reports whether the Conn has started closing.
func (c *Conn) isClosing() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// keepRole is the reader goroutine's check between frames, with nothing
// buffered: when a caller missed the role since the last check, it leaves
// the role to the callers (offered to the followers, or free for the next
// caller) and waits until it is its own again. It returns once the reader
// goroutine holds the role.
func (c *Conn) keepRole() {
	l := c.lead
	if !l.missed.Load() {
		return
	}
	l.missed.Store(false)
	l.freedAt.Store(int64(time.Since(l.start)))
	if l.followers.Load() > 0 {
		c.offerRole()
	} else {
		park.Publish32(&l.state, roleFree) // see releaseRole
		if l.followers.Load() > 0 && l.state.CompareAndSwap(roleFree, roleReader) {
			c.offerRole() // a caller became a follower meanwhile
		}
		if !l.armed.Swap(true) {
			l.timer.Reset(l.linger)
		}
	}
	done := c.done
	for {
		select {
		case <-l.give:
			return
		case <-l.timer.C:
			l.armed.Store(false)
			st := l.state.Load()
			if st == roleCaller {
				c.watchLeader()
				continue
			}
			if idle := time.Since(l.start) - time.Duration(l.freedAt.Load()); idle < l.linger {
				if !l.armed.Swap(true) {
					l.timer.Reset(l.linger - idle)
				}
				continue
			}
			if st == roleOffered {
				// Offered for the linger and not taken: no follower
				// waits for it.
				if c.reclaimOffer() {
					return
				}
				continue
			}
		case <-done:
			done = nil // a caller reading sees the socket close and gives the role back
			if l.state.Load() == roleOffered && c.reclaimOffer() {
				return
			}
		}
		if l.state.CompareAndSwap(roleFree, roleReader) {
			return
		}
	}
}

// reclaimOffer takes an offered role back for the reader goroutine.
func (c *Conn) reclaimOffer() bool {
	l := c.lead
	select {
	case <-l.offer:
		l.state.Store(roleReader)
		return true
	default:
		return false // a follower took it
	}
}
