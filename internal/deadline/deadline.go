// Package deadline gives a context with a deadline whose timer is made only
// when something waits on its Done channel.
//
// context.WithDeadline arms a runtime timer at once and stops it at cancel:
// a few microseconds per call on a path that runs once per message (a
// tensor's fetch, its export), most of which never block on Done but only
// poll Err. WithDeadline here answers Err by comparing the clock with the
// deadline (and asking the parent), and arms the timer, and the parent's
// propagation, the first time Done is called. It keeps context.Context's
// contract: Err is nil exactly while Done is not closed, and once Err has
// reported the end, Done is closed.
package deadline

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/internal/mono"
)

// Ctx is the context WithDeadline, WithTimeout and NewTimeout return.
type Ctx struct {
	parent   context.Context
	deadline time.Time
	at       int64 // deadline on mono's clock: Err reads the clock once

	mu    sync.Mutex
	done  chan struct{} // nil until Done is called or the context ends
	err   error         // set once, when the context ends
	ended atomic.Bool   // err is set: Err takes mu only then
	armed atomic.Bool   // Done was called: a timer or a channel may need ending
	timer *time.Timer   // armed by Done
	stop  func() bool   // stops the parent's propagation, armed by Done
}

// closed is a closed channel, the Done of a context that ended before
// anybody asked for it.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// WithDeadline returns a context that ends when d passes, when parent ends
// or when cancel is called, as context.WithDeadline does, without a timer
// until Done is called. Call cancel once the work is done.
func WithDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	if pd, ok := parent.Deadline(); ok && pd.Before(d) {
		d = pd
	}
	c := &Ctx{parent: parent, deadline: d, at: mono.Of(d)}
	return c, c.Cancel
}

// Cancel ends c with context.Canceled (the cancel function of
// WithDeadline and WithTimeout).
func (c *Ctx) Cancel() { c.end(context.Canceled) }

// Release is Cancel for a context nothing else holds once its user is
// done with it: when Done was never called there is no timer to stop and
// no channel to close, and it does nothing (no lock taken); otherwise it
// cancels. A context released unarmed is not canceled: its Err stays nil
// until its deadline.
func (c *Ctx) Release() {
	if c.armed.Load() {
		c.Cancel()
	}
}

// WithTimeout is WithDeadline(parent, time.Now().Add(timeout)), reading
// only the monotonic clock (time.Now reads the wall clock too).
func WithTimeout(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	c := NewTimeout(parent, timeout)
	return c, c.Cancel
}

// NewTimeout is WithTimeout for a caller that calls Cancel itself, which
// spares the allocation of a cancel function.
func NewTimeout(parent context.Context, timeout time.Duration) *Ctx {
	at := mono.Now() + min(int64(timeout), math.MaxInt64/2) // no overflow
	d := mono.Time(at)
	if pd, ok := parent.Deadline(); ok {
		if pat := mono.Of(pd); pat < at {
			d, at = pd, pat
		}
	}
	return &Ctx{parent: parent, deadline: d, at: at}
}

func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *Ctx) Value(key any) any { return c.parent.Value(key) }

// Err reports why the context ended, nil while it has not: it looks at
// the parent and the clock itself, and ends the context (closing Done)
// when either says it is over.
func (c *Ctx) Err() error {
	if c.ended.Load() {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		return err
	}
	if err := c.parent.Err(); err != nil {
		return c.end(err)
	}
	if mono.Now() >= c.at {
		return c.end(context.DeadlineExceeded)
	}
	return nil
}

// Done arms the deadline's timer and the parent's propagation on its first
// call.
func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.armed.Store(true)
	c.done = make(chan struct{})
	c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		// Runs f at once, in a goroutine of its own, when the parent has
		// already ended: end then waits for c.mu.
		c.stop = context.AfterFunc(c.parent, func() { c.end(c.parent.Err()) })
	}
	return c.done
}

// end ends the context with err unless it has ended already, and returns
// the error it ended with.
func (c *Ctx) end(err error) error {
	c.mu.Lock()
	if c.err != nil {
		err = c.err
		c.mu.Unlock()
		return err
	}
	c.err = err
	c.ended.Store(true)
	if c.done == nil {
		c.done = closed
	} else {
		close(c.done)
	}
	timer, stop := c.timer, c.stop
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if stop != nil {
		stop()
	}
	return err
}

func (c *Ctx) String() string { return "deadline.WithDeadline(" + c.deadline.String() + ")" }
