package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// DefaultRegionBudget is Config.RegionBudget's default: 256 MiB, the
// regions of about 120 connections with the default 1 MiB rings.
const DefaultRegionBudget = 256 << 20

// ErrRefused is wrapped (with ErrFallback) by the error of an upgrade that
// Limits refused on this end: another upgrade with the same peer name is in
// flight, or the region would pass the budget. The connection stays on its
// socket.
var ErrRefused = errors.New("shm: upgrade refused here")

// Limits bounds the shared-memory upgrades of one node: at most one in
// flight per peer name and direction, and the bytes of the regions in
// flight or established (mapped by this end) within Config.RegionBudget.
// A peer that starts hundreds of upgrades at once thus holds at most one
// region and its four FIFOs, not hundreds. Its methods are safe for
// concurrent use.
type Limits struct {
	budget int64

	mu       sync.Mutex
	used     int64                 // bytes of regions reserved
	inflight map[limitKey]struct{} // peers with an upgrade in flight
}

type limitKey struct {
	peer      string
	initiator bool
}

// NewLimits returns the limits of cfg: its RegionBudget (DefaultRegionBudget
// when 0; Usable rejects a negative one).
func NewLimits(cfg Config) *Limits {
	return &Limits{budget: cfg.regionBudget(), inflight: make(map[limitKey]struct{})}
}

// Upgrade runs Upgrade within the limits, for the peer named peer (as its
// handshake authenticated it). A refusal still runs the exchange, declining,
// so both ends stay on the socket: the error wraps ErrFallback and
// ErrRefused and says why. The region's bytes stay counted until the
// returned Conn is closed.
func (l *Limits) Upgrade(ctx context.Context, nc net.Conn, cfg Config, initiator bool, peer string) (net.Conn, error) {
	k := limitKey{peer, initiator}
	l.mu.Lock()
	_, busy := l.inflight[k]
	if !busy {
		l.inflight[k] = struct{}{}
	}
	l.mu.Unlock()
	if busy {
		return upgrade(ctx, nc, cfg, initiator, nil,
			fmt.Errorf("%w: an upgrade with %q is in flight already", ErrRefused, peer))
	}
	defer func() {
		l.mu.Lock()
		delete(l.inflight, k)
		l.mu.Unlock()
	}()
	return upgrade(ctx, nc, cfg, initiator, l, nil)
}

// reserve counts n bytes of a region against the budget and returns the
// function that gives them back (once), or why it cannot.
func (l *Limits) reserve(n int64) (func(), error) {
	if l == nil {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used+n > l.budget {
		return nil, fmt.Errorf("%w: a region of %d bytes would pass the budget (%d of %d bytes in use)", ErrRefused, n, l.used, l.budget)
	}
	l.used += n
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.used -= n
			l.mu.Unlock()
		})
	}, nil
}

// Used returns the bytes of regions counted now.
func (l *Limits) Used() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}
