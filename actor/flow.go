package actor

import (
	"context"
	"reflect"
	"sync"

	"github.com/tensorferry/tensorferry/tensor"
)

// Defaults of WithMaxInFlight.
const (
	DefaultMaxInFlight      = 64
	DefaultMaxInFlightBytes = 4 << 30
)

// WithMaxInFlight bounds what a node has sent to one peer in messages with
// tensors to fetch that the peer has not fetched yet: at most msgs such
// messages (default DefaultMaxInFlight) holding at most bytes of those
// tensors (default DefaultMaxInFlightBytes; a larger message goes alone). A
// sender beyond either waits in Send until the peer releases earlier
// tensors: the receiver's queue, and the destination memory it allocates
// for queued tensors, stay bounded, and its reader never has to stop
// reading the connection (which also carries the control requests its
// fetches wait on). Values <= 0 keep the default.
func WithMaxInFlight(msgs int, bytes int64) Option {
	return func(o *options) {
		if msgs > 0 {
			o.maxInFlight = msgs
		}
		if bytes > 0 {
			o.maxInFlightBytes = bytes
		}
	}
}

// credits counts the messages and tensor bytes in flight to one peer.
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

// acquire takes one message credit and b bytes, waiting while all are
// used, until ctx is done or gone is closed (the peer went down). A
// message of more than the byte budget goes when nothing else is in
// flight.
func (c *credits) acquire(ctx context.Context, gone <-chan struct{}, b int64) error {
	for {
		c.mu.Lock()
		if c.used < c.max && (c.used == 0 || c.bytes+b <= c.maxBytes) {
			c.used++
			c.bytes += b
			c.mu.Unlock()
			return nil
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
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

// inFlight is one sent message's exports that count against its peer's
// credits; the credit comes back when the last of them ends.
type inFlight struct {
	c     *credits
	bytes int64 // taken with the credit
	left  int   // guarded by Node.flowMu
}

// track counts the exports of a message sent with a credit of c and b
// bytes; with no such export, the credit comes back at once.
func (n *Node) track(c *credits, b int64, exports []*tensor.Export) {
	if len(exports) == 0 {
		c.release(b)
		return
	}
	f := &inFlight{c: c, bytes: b, left: len(exports)}
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
		f.c.release(f.bytes)
	}
}

// tensorBytes sums the sizes of the tensors of msg that go out of band
// (larger than inline), the bytes its credit takes. Refs do not count:
// they are fetched when their receiver wants, not before delivery.
func tensorBytes(msg any, inline int64) int64 {
	if msg == nil {
		return 0
	}
	return walkBytes(reflect.ValueOf(msg), inline, map[uintptr]bool{}, 0)
}

// maxWalkDepth bounds the nesting tensorBytes follows.
const maxWalkDepth = 32

func walkBytes(v reflect.Value, inline int64, seen map[uintptr]bool, depth int) int64 {
	if depth > maxWalkDepth || !v.IsValid() || !carriesTensors(v.Type()) {
		return 0
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] {
			return 0
		}
		seen[v.Pointer()] = true
		if v.Type().Elem() == tensorType {
			if n := v.Interface().(*tensor.Tensor).ByteSize(); n > inline {
				return n
			}
			return 0
		}
		return walkBytes(v.Elem(), inline, seen, depth+1)
	case reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return walkBytes(v.Elem(), inline, seen, depth+1)
	case reflect.Struct:
		var sum int64
		for i := range v.NumField() {
			if f := v.Field(i); f.CanInterface() {
				sum += walkBytes(f, inline, seen, depth+1)
			}
		}
		return sum
	case reflect.Slice, reflect.Array:
		var sum int64
		for i := range v.Len() {
			sum += walkBytes(v.Index(i), inline, seen, depth+1)
		}
		return sum
	case reflect.Map:
		var sum int64
		for it := v.MapRange(); it.Next(); {
			sum += walkBytes(it.Key(), inline, seen, depth+1) + walkBytes(it.Value(), inline, seen, depth+1)
		}
		return sum
	}
	return 0
}
