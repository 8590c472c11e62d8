package actor

import (
	"context"
	"sync"

	"github.com/tensorferry/tensorferry/tensor"
)

// DefaultMaxInFlight is the default of WithMaxInFlight.
const DefaultMaxInFlight = 64

// WithMaxInFlight bounds the messages with tensors to fetch that a node
// has sent to one peer and the peer has not fetched yet (default
// DefaultMaxInFlight). A sender beyond it waits in Send until the peer
// releases earlier tensors: the receiver's queue, and the destination
// memory it allocates for queued tensors, stay bounded, and its reader
// never has to stop reading the connection (which also carries the control
// requests its fetches wait on).
func WithMaxInFlight(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxInFlight = n
		}
	}
}

// credits counts the messages in flight to one peer.
type credits struct {
	mu      sync.Mutex
	used    int
	max     int
	changed chan struct{} // closed and replaced when used falls
}

func newCredits(max int) *credits { return &credits{max: max, changed: make(chan struct{})} }

// acquire takes one credit, waiting while all are used, until ctx is done
// or gone is closed (the peer went down).
func (c *credits) acquire(ctx context.Context, gone <-chan struct{}) error {
	for {
		c.mu.Lock()
		if c.used < c.max {
			c.used++
			c.mu.Unlock()
			return nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-gone:
			return ErrNodeDown
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *credits) release() {
	c.mu.Lock()
	c.used--
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// inFlight is one sent message's exports that count against its peer's
// credits; the credit comes back when the last of them ends.
type inFlight struct {
	c    *credits
	left int // guarded by Node.flowMu
}

// track counts the exports of a message sent with a credit of c; with no
// such export, the credit comes back at once.
func (n *Node) track(c *credits, exports []*tensor.Export) {
	if len(exports) == 0 {
		c.release()
		return
	}
	f := &inFlight{c: c, left: len(exports)}
	n.flowMu.Lock()
	for _, e := range exports {
		n.flow[e.ID] = f
	}
	n.flowMu.Unlock()
}

// exportEnded is the store's OnEnd hook: a tracked export's end may give
// its message's credit back.
func (n *Node) exportEnded(e *tensor.Export) {
	n.flowMu.Lock()
	f := n.flow[e.ID]
	delete(n.flow, e.ID)
	last := false
	if f != nil {
		f.left--
		last = f.left == 0
	}
	n.flowMu.Unlock()
	if last {
		f.c.release()
	}
}
