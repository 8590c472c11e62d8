package wire

import (
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/internal/park"

	"go.uber.org/zap"
)

// Handler take-over (ConnOptions.HandlerTakeover).
//
// A Conn's reader marks each guarded Handler call in Conn.rstate: a call
// sequence number and a phase. One watchdog goroutine per process looks at
// every Conn that asked for take-over once per tick; a Conn found in the
// same call at two ticks in a row has a Handler that has run for at least a
// tick, and the watchdog hands the reading to a new goroutine by moving the
// phase from blocking (the call declared MayBlock) to abandoned; ExpectReply
// and a caller in Conn.Await do the same at once (takeOver). The reader stuck in Handler sees the
// phase changed when Handler returns and ends without touching the
// connection again. The new reader inherits the old one's place in the
// Conn's WaitGroup. The watchdog parks when no guarded call happened
// during a tick, and the next guarded call wakes it.

// Phases of Conn.rstate (low two bits; the rest is the call sequence).
// Only a call that Handler marked with Conn.MayBlock (phaseBlocking) is
// taken over: until then the frame has no place in any order downstream (an
// actor's mailbox, a peer's inbox), and a new reader handling the next
// frame meanwhile could put it first. A call merely slow (a starved
// processor) is waited for.
const (
	phaseReading   uint64 = 0
	phaseHandling  uint64 = 1
	phaseAbandoned uint64 = 2
	phaseBlocking  uint64 = 3
	phaseMask      uint64 = 3
)

// MayBlock tells the Conn, from within Handler, that the frame being
// handled has taken its place downstream (the handler queued it where later
// frames will queue behind it) and that the rest of the call may block:
// with ConnOptions.HandlerTakeover, a new reader may now take over. Outside
// a guarded Handler call it does nothing.
func (c *Conn) MayBlock() {
	s := c.rstate.Load()
	if s&phaseMask == phaseHandling {
		c.rstate.CompareAndSwap(s, s&^phaseMask|phaseBlocking)
	}
}

// ExpectReply tells the Conn that the calling goroutine is about to wait,
// by means of its own rather than Await (a protoactor future), for a frame
// from the peer. A Handler call in progress that has declared MayBlock is
// taken over at once, as Await takes it over: the waiter may be that very
// call, whose reply no one else would read until HandlerTakeover. Outside
// such a call it does nothing.
func (c *Conn) ExpectReply() { c.takeOverBlocked() }

// takeoverWatch is the process's watchdog.
var takeoverWatch = &watchdog{park: park.NewParker()}

type watchdog struct {
	mu      sync.Mutex
	conns   map[*Conn]uint64 // rstate seen at the last tick
	running bool
	stop    chan struct{} // closed when the last Conn leaves
	park    *park.Parker  // where it waits for a guarded call
}

// register adds c; the watchdog starts with the first Conn.
func (w *watchdog) register(c *Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conns == nil {
		w.conns = make(map[*Conn]uint64)
	}
	w.conns[c] = c.rstate.Load()
	if !w.running {
		w.running = true
		w.stop = make(chan struct{})
		go w.loop(w.stop)
	}
}

// unregister removes c; the watchdog ends with the last Conn.
func (w *watchdog) unregister(c *Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.conns[c]; !ok {
		return
	}
	delete(w.conns, c)
	if len(w.conns) == 0 && w.running {
		w.running = false
		close(w.stop)
	}
}

// poke wakes a parked watchdog; readers call it after entering a guarded
// Handler call.
func (w *watchdog) poke() { w.park.Unpark() }

func (w *watchdog) loop(stop chan struct{}) {
	t := time.NewTimer(w.period())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		// Nothing was handled during the tick: park until a reader
		// enters a guarded call (Conn.handleFrame publishes it).
		if !w.scan() && !w.park.Park(w.busy, stop) {
			return
		}
		t.Reset(w.period())
	}
}

// period is half the shortest take-over delay among the Conns, so that a
// call is taken over after between one and two periods.
func (w *watchdog) period() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := time.Duration(0)
	for c := range w.conns {
		if d := c.opts.HandlerTakeover / 2; p == 0 || d < p {
			p = d
		}
	}
	return max(p, 100*time.Microsecond)
}

// scan takes over every Conn still in the call it was in at the last tick
// and reports whether any guarded call happened since the last tick (or is
// in progress).
func (w *watchdog) scan() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	active := false
	for c, seen := range w.conns {
		s := c.rstate.Load()
		if s != seen {
			active = true
		}
		if ph := s & phaseMask; ph == phaseHandling || ph == phaseBlocking {
			active = true
			if ph == phaseBlocking && s == seen && c.takeOver(s) {
				c.log.Debug("wire: handler still running, reading goes on in a new goroutine", zap.Duration("after", c.opts.HandlerTakeover))
				s = c.rstate.Load()
			}
		}
		w.conns[c] = s
	}
	return active
}

// busy reports whether a guarded call is in progress on any Conn.
func (w *watchdog) busy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.conns {
		if ph := c.rstate.Load() & phaseMask; ph == phaseHandling || ph == phaseBlocking {
			return true
		}
	}
	return false
}
