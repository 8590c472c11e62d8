package transfer

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// RelayChannel is the name under which Stats counts the bytes a node
// copied from its own copy of a content instead of fetching them again
// (fan-out by relay, relay.go).
const RelayChannel = "relay"

// relayKey names one content: what descriptors with the same key lend is
// the same bytes (tensor.Descriptor.Content).
type relayKey struct {
	owner       string
	incarnation uint64
	content     uint64
}

// relayFlight is a fetch of one content in progress on this node, which
// later fetches of that content join instead of crossing the link again.
type relayFlight struct {
	d     *tensor.Descriptor // the leader's: followers must match its type
	ready chan struct{}      // closed when the leader's fetch ended
	src   *tensor.Tensor     // the leader's destination; read only after ready, if err is nil
	err   error
	// copies counts the followers that joined: the leader's destination
	// stays unchanged (neither delivered nor freed) until they copied it.
	copies sync.WaitGroup
	joined int // followers that joined, under relays.mu (for tests)
}

// relays is a node's fetches of contents in flight.
type relays struct {
	mu sync.Mutex
	m  map[relayKey]*relayFlight
}

// relayEligible reports whether a fetch of d may lead or join a relay.
func (e *Engine) relayEligible(d *tensor.Descriptor) bool {
	return !e.cfg.Flow.NoRelay && d.Content != 0 && d.Bytes >= e.cfg.Flow.RelayMinBytes
}

// mayRelay reports whether one of in's fetches may lead or join a relay:
// such a message is fetched on a goroutine of its own, not on the reader
// or the delivery loop, so that the peer's next messages, which may lend
// the same content, are read and join its fetch instead of waiting for
// it. (What that costs, a goroutine's start, is small beside a transfer
// of RelayMinBytes.)
func (in *Incoming) mayRelay() bool {
	if in == nil {
		return false
	}
	for _, j := range in.jobs {
		if in.e.relayEligible(j.d) {
			return true
		}
	}
	return false
}

// fetchShared is fetchInto for a descriptor whose content this node may
// already be fetching: the first fetch of a content (the leader) goes to
// the owner; a fetch that starts while it runs (a follower) waits for it
// and copies the leader's destination on this node, device to device. The
// leader returns only once its followers have copied, so its destination
// is neither delivered (and written by its actor) nor freed before. A
// follower whose leader failed, or whose copy fails, fetches from the
// owner. Each fetch keeps its own descriptor, whose lease is released to
// the owner as any other.
func (e *Engine) fetchShared(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	if !e.relayEligible(d) {
		return e.fetchInto(ctx, d, dst)
	}
	k := relayKey{d.Owner, d.Incarnation, d.Content}
	e.relays.mu.Lock()
	if f := e.relays.m[k]; f != nil && sameContent(f.d, d) {
		f.copies.Add(1)
		f.joined++
		e.relays.mu.Unlock()
		err := e.follow(ctx, f, d, dst)
		f.copies.Done()
		if err == nil {
			return nil
		}
		return e.fetchInto(ctx, d, dst) // the leader failed: from the owner
	}
	f := &relayFlight{d: d, ready: make(chan struct{})}
	if e.relays.m == nil {
		e.relays.m = map[relayKey]*relayFlight{}
	}
	e.relays.m[k] = f
	e.relays.mu.Unlock()
	err := e.fetchInto(ctx, d, dst)
	f.src, f.err = dst, err
	close(f.ready)
	e.relays.mu.Lock()
	if e.relays.m[k] == f {
		delete(e.relays.m, k)
	}
	e.relays.mu.Unlock()
	f.copies.Wait() // no follower joins f any more
	return err
}

// follow copies f's content into dst once f's leader has it.
func (e *Engine) follow(ctx context.Context, f *relayFlight, d *tensor.Descriptor, dst *tensor.Tensor) error {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.err != nil {
		return f.err
	}
	start := time.Now()
	if err := memory.Copy(ctx, dst.Buffer(), f.src.Buffer()); err != nil {
		return err
	}
	e.stats.addBytes(d.Owner, RelayChannel, d.Bytes, time.Since(start))
	return nil
}

// sameContent reports whether b, with a's content key, also has a's type:
// a descriptor that says otherwise is not trusted to name a's bytes.
func sameContent(a, b *tensor.Descriptor) bool {
	return a.DType == b.DType && a.Bytes == b.Bytes && slices.Equal(a.Shape, b.Shape)
}

// relayJoined returns how many followers joined the flight of content c
// of owner now in flight (-1: none in flight), for tests.
func (e *Engine) relayJoined(owner string, incarnation, c uint64) int {
	e.relays.mu.Lock()
	defer e.relays.mu.Unlock()
	if f := e.relays.m[relayKey{owner, incarnation, c}]; f != nil {
		return f.joined
	}
	return -1
}
