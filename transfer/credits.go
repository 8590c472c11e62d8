package transfer

import (
	"context"
	"sync"

	"github.com/tensorferry/tensorferry/tensor"
)

// credits counts the messages with tensors to fetch, and their bytes, that
// a node sent to one peer and the peer has not fetched yet. The limits are
// the smaller of the sender's (Config.MaxInFlight...) and the window the
// peer advertised: a sender that respects them never overfills the
// receiver's inbox.
type credits struct {
	mu       sync.Mutex
	used     int
	bytes    int64
	max      int
	maxBytes int64
	changed  chan struct{} // made by a waiter, closed when used falls
}

func newCredits(max int, maxBytes int64) *credits {
	return &credits{max: max, maxBytes: maxBytes}
}

// tryAcquire takes one message credit and b bytes if they are free; a
// message of more than the byte limit goes when nothing else is in flight.
// When they are not free it returns a channel closed when some come back.
func (c *credits) tryAcquire(b int64) (ok bool, changed <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used < c.max && (c.used == 0 || c.bytes+b <= c.maxBytes) {
		c.used++
		c.bytes += b
		return true, nil
	}
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return false, c.changed
}

// acquire is tryAcquire that waits, until ctx is done or gone is closed.
func (c *credits) acquire(ctx context.Context, gone <-chan struct{}, b int64) error {
	for {
		ok, ch := c.tryAcquire(b)
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-gone:
			return ErrPeerDown
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *credits) release(b int64) {
	c.mu.Lock()
	c.used--
	c.bytes -= b
	if c.changed != nil { // someone waits
		close(c.changed)
		c.changed = nil
	}
	c.mu.Unlock()
}

// inUse returns the messages and bytes taken.
func (c *credits) inUse() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, c.bytes
}

// inFlight is one sent message's exports that count against its peer's
// credits; the credit comes back when the last of them ends.
type inFlight struct {
	c     *credits
	bytes int64 // taken with the credit
	left  int   // guarded by Engine.flowMu
}

// track counts the exports of a message sent with a credit of c and b
// bytes; with no such export, the credit comes back at once.
func (e *Engine) track(c *credits, b int64, exports []*tensor.Export) {
	if len(exports) == 0 {
		c.release(b)
		return
	}
	f := &inFlight{c: c, bytes: b, left: len(exports)}
	e.flowMu.Lock()
	for _, x := range exports {
		e.flow[x.ID] = f
	}
	e.flowMu.Unlock()
}

// exportEnded is the store's OnEnd hook: a tracked export's end may give
// its message's credit back.
func (e *Engine) exportEnded(x *tensor.Export) {
	e.relayExportEnded(x)
	e.flowMu.Lock()
	f := e.flow[x.ID]
	delete(e.flow, x.ID)
	last := false
	if f != nil {
		f.left--
		last = f.left == 0
	}
	e.flowMu.Unlock()
	if last {
		f.c.release(f.bytes)
	}
}

// budget is a byte semaphore: what a receiver allocates for tensors being
// fetched. Waiters are served in order (a large request is not starved by
// small ones).
type budget struct {
	mu      sync.Mutex
	used    int64
	max     int64
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed when granted
}

func newBudget(max int64) *budget { return &budget{max: max} }

// tryAcquire takes n when it is free now and nobody waits for the budget.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) == 0 && b.used+n <= b.max {
		b.used += n
		return true
	}
	return false
}

// acquire takes n bytes (n <= max), waiting until they are free, ctx is
// done or gone is closed.
func (b *budget) acquire(ctx context.Context, gone <-chan struct{}, n int64) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.max {
		b.used += n
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-gone:
		err = ErrPeerDown
	case <-ctx.Done():
		err = ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted meanwhile: give it back
		b.used -= n
	default:
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
	}
	b.grantLocked()
	return err
}

// grantLocked grants the waiters at the head of the queue that fit.
func (b *budget) grantLocked() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.max {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.grantLocked()
	b.mu.Unlock()
}

// inUse returns the bytes taken.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// waiting returns the number of acquires waiting for room.
func (b *budget) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiters)
}
