// Package park is the one "publish a flag, check again, then sleep"
// handshake of tensorferry: a waiter that finds nothing to do announces
// that it will sleep, checks once more, and only then sleeps; a waker
// publishes what it made ready, then wakes the waiter if it announced
// itself. Either the waiter's second check sees the waker's write or the
// waker sees the waiter's flag: no wake-up is lost, and a waker whose
// waiter is awake pays one load.
//
// The order holds only if neither side's load can pass its own earlier
// store: both stores are read-modify-writes here (Swap, CompareAndSwap).
// On amd64 and arm64 a plain atomic Store is one already, but under the
// race detector Go's atomics are only release and acquire
// (golang/go#58020), which lets the two cross and reports, or causes, a
// lost wake-up. Every such handshake goes through this package, so that
// the rule is kept in one place: Publish for the waker's write, Wait for
// the waiter, Wake for the waker.
//
// The flag is an *atomic.Uint32 so that it may live in memory shared with
// another process (shm's rings); Parker pairs one with a channel for one
// goroutine of a process, Gate a count of waiters with a channel for any
// number of them.
package park

import (
	"sync"
	"sync/atomic"
)

// Publish stores v in x as a read-modify-write, so that the caller's
// following load of a waiter's flag (Wake) cannot pass it.
func Publish(x *atomic.Uint64, v uint64) { x.Swap(v) }

// Publish32 is Publish for a 32-bit word.
func Publish32(x *atomic.Int32, v int32) { x.Swap(v) }

// Wait is the waiter's side: it sets flag, checks ready once more, and
// sleeps (sleep) only if ready still reports false. It clears flag before
// it returns, and returns sleep's error, or nil when it did not sleep.
// The waker clears flag itself when it wakes the waiter (Wake).
func Wait(flag *atomic.Uint32, ready func() bool, sleep func() error) error {
	flag.Swap(1)
	if ready() {
		flag.CompareAndSwap(1, 0)
		return nil
	}
	err := sleep()
	flag.Store(0)
	return err
}

// Wake is the waker's side, after it published what it made ready
// (Publish, or any read-modify-write): it reports whether the waiter
// announced itself (flag set), clearing flag, in which case the caller
// must wake it. A waiter that is awake costs one load.
func Wake(flag *atomic.Uint32) bool {
	return flag.Load() != 0 && flag.CompareAndSwap(1, 0)
}

// Parker is one goroutine's place to sleep until another wakes it: the
// flag of Wait and Wake with a channel. Its zero value is not usable: use
// NewParker. One goroutine waits at a time; any number may wake it.
type Parker struct {
	flag atomic.Uint32
	ch   chan struct{}
}

// NewParker returns a Parker.
func NewParker() *Parker { return &Parker{ch: make(chan struct{}, 1)} }

// Park sleeps until Unpark, unless ready reports true once the waiter has
// announced itself; it returns early, with false, when stop is closed (nil:
// never). A wake-up that came while the waiter was awake is kept for the
// next Park, which then returns at once: the caller checks again what it
// waits for.
func (p *Parker) Park(ready func() bool, stop <-chan struct{}) bool {
	stopped := false
	_ = Wait(&p.flag, ready, func() error {
		select {
		case <-p.ch:
		case <-stop:
			stopped = true
		}
		return nil
	})
	return !stopped
}

// Parked reports whether a goroutine sleeps in Park, or is about to:
// for tests, which have no other way to see it.
func (p *Parker) Parked() bool { return p.flag.Load() != 0 }

// Unpark wakes the goroutine in Park, if it sleeps or is about to; the
// caller has published first what it waits for.
func (p *Parker) Unpark() {
	if Wake(&p.flag) {
		select {
		case p.ch <- struct{}{}:
		default:
		}
	}
}

// Gate is where any number of goroutines sleep until a waker opens it:
// Wait and Wake's handshake with a count of waiters in place of the flag,
// and a channel that Open closes. Its zero value is ready to use.
type Gate struct {
	waiting atomic.Int32 // goroutines in Wait, counted before their check
	mu      sync.Mutex
	ch      chan struct{} // closed by Open; nil until a waiter needs one
}

// Wait sleeps until Open, unless ready reports true once the caller has
// announced itself; it returns early, with false, when stop or stop2 is
// closed (nil: never), and otherwise true: the caller checks again what it
// waits for.
func (g *Gate) Wait(ready func() bool, stop, stop2 <-chan struct{}) bool {
	g.waiting.Add(1) // a read-modify-write: ready's loads cannot pass it
	defer g.waiting.Add(-1)
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	ch := g.ch
	g.mu.Unlock()
	if ready() {
		return true
	}
	select {
	case <-ch:
		return true
	case <-stop:
	case <-stop2:
	}
	return false
}

// Open wakes every goroutine in Wait; the caller has published first, with
// a read-modify-write, what they wait for. With none waiting it costs one
// load.
func (g *Gate) Open() {
	if g.waiting.Load() == 0 {
		return
	}
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}
