//go:build linux

package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorferry/tensorferry/internal/park"
	"github.com/tensorferry/tensorferry/wire"
	"golang.org/x/sys/unix"
)

// Conn is a byte stream between two processes of one host through a pair of
// rings in shared memory, one per direction, made by Upgrade from an
// authenticated socket. It implements net.Conn, so a wire.Conn runs on it
// unchanged. The socket stays open beside the rings, silent, as the
// liveness channel: when the peer closes it or dies (the kernel closes it
// then), Read returns what the peer wrote before and then io.EOF, and Write
// fails. Close closes both.
//
// A Read or Write that finds nothing to do spins for a while (see
// Config.Spin), then sleeps on a FIFO in the shared directory that the
// other end writes one byte to when it sets data or room free for a
// sleeper. Read and Write may run concurrently with each other; concurrent
// Reads (or Writes) are serialized.
type Conn struct {
	nc  net.Conn
	reg *region
	// in: the ring this end reads; out: the ring it writes.
	in, out *ring
	// inData: the bell this end's reader sleeps on; outSpace: the bell its
	// writer sleeps on; outData and inSpace: the bells it rings for the
	// peer's reader and writer.
	inData, inSpace, outData, outSpace *bell

	rmu, wmu     sync.Mutex // held by Read and by Write, and by Close to unmap
	rspin, wspin spinner

	closed    atomic.Bool
	gone      atomic.Pointer[error] // why the peer is gone, set once
	faulted   atomic.Pointer[error] // the mapping faulted: nothing may touch it again
	rdl, wdl  atomic.Int64          // deadlines, UnixNano; 0: none
	closeOnce sync.Once
	liveDone  chan struct{}
	release   func() // gives the region's bytes back to Limits; nil: none
}

var _ net.Conn = (*Conn)(nil)

func newConn(reg *region, creator bool, nc net.Conn, spin time.Duration) *Conn {
	c := &Conn{nc: nc, reg: reg, liveDone: make(chan struct{})}
	r0, r1 := newRing(reg.mem, 0, reg.ringSize), newRing(reg.mem, 1, reg.ringSize)
	// The creator writes ring 0 and reads ring 1.
	if creator {
		c.out, c.in = r0, r1
		c.outData, c.outSpace, c.inData, c.inSpace = reg.bells[0], reg.bells[1], reg.bells[2], reg.bells[3]
	} else {
		c.in, c.out = r0, r1
		c.inData, c.inSpace, c.outData, c.outSpace = reg.bells[0], reg.bells[1], reg.bells[2], reg.bells[3]
	}
	c.rspin = newSpinner(spinLimit(spin))
	c.wspin = newSpinner(spinLimit(spin))
	go c.watch()
	return c
}

// watch reads the socket until it ends: the peer never writes on it after
// the upgrade, so anything it reads means the peer is gone (or broke the
// protocol).
func (c *Conn) watch() {
	defer close(c.liveDone)
	var b [1]byte
	_, err := c.nc.Read(b[:])
	if c.closed.Load() {
		return
	}
	switch {
	case err == nil:
		err = errors.New("shm: the peer wrote on the liveness socket")
	case errors.Is(err, io.EOF):
		err = io.EOF
	default:
		err = fmt.Errorf("shm: liveness socket: %w", err)
	}
	c.gone.CompareAndSwap(nil, &err)
	// Wake this end's sleepers: they find the peer gone.
	c.inData.ring()
	c.outSpace.ring()
}

// Read reads from the peer's ring. Once the peer is gone and its ring is
// drained, it returns io.EOF (or why the liveness socket failed); an error
// wrapping ErrCorrupt when the peer broke the ring's indices.
func (c *Conn) Read(p []byte) (n int, err error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if err := c.usable(); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	// A fault on the mapping is a panic that catchFault recovers, not a
	// crash of the process (no closure: nothing allocated per call).
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer c.catchFault(&err)
	for {
		if err := c.pastDeadline(&c.rdl); err != nil {
			return 0, err
		}
		gone := c.gone.Load() // before the ring: what the peer wrote before going is read
		avail, err := c.in.readable()
		if err != nil {
			return 0, err
		}
		if avail > 0 {
			n = c.in.read(p, avail)
			if park.Wake(c.in.prodWait) {
				c.inSpace.ring()
			}
			return n, nil
		}
		if gone != nil {
			return 0, *gone
		}
		in := c.in
		if err := c.wait(&c.rspin, in.consWait, c.inData, func() bool {
			return in.tail.Load() != in.pos || c.gone.Load() != nil || c.closed.Load() || c.pastDeadline(&c.rdl) != nil
		}); err != nil {
			return 0, err
		}
	}
}

// InterruptibleReads marks a Conn as a wire.InterruptibleReader: a read
// deadline set in the past ends a Read that waits (spinning or asleep)
// with os.ErrDeadlineExceeded and nothing read, so a caller waiting for
// its reply may read the rings itself (wire.Conn.Await).
func (c *Conn) InterruptibleReads() {}

var _ wire.InterruptibleReader = (*Conn)(nil)

// Write writes p into the ring to the peer, waiting for room as needed.
func (c *Conn) Write(p []byte) (n int, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.usable(); err != nil {
		return 0, err
	}
	// A fault on the mapping is a panic that catchFault recovers, not a
	// crash of the process (no closure: nothing allocated per call).
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer c.catchFault(&err)
	for n < len(p) {
		if err := c.pastDeadline(&c.wdl); err != nil {
			return n, err
		}
		if gone := c.gone.Load(); gone != nil {
			return n, fmt.Errorf("shm: write: the peer is gone (%w): %w", *gone, syscall.EPIPE)
		}
		free, err := c.out.writable()
		if err != nil {
			return n, err
		}
		if free > 0 {
			n += c.out.write(p[n:], free)
			if park.Wake(c.out.consWait) {
				c.outData.ring()
			}
			continue
		}
		out := c.out
		if err := c.wait(&c.wspin, out.prodWait, c.outSpace, func() bool {
			return out.pos-out.head.Load() != out.size || c.gone.Load() != nil || c.closed.Load()
		}); err != nil {
			return n, err
		}
	}
	return n, nil
}

// usable returns why the Conn may not be used, or nil.
func (c *Conn) usable() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if f := c.faulted.Load(); f != nil {
		return *f
	}
	return nil
}

// catchFault turns a fault on the mapping (the peer truncated the file
// behind it: SIGBUS) into an error of this Conn, for good.
func (c *Conn) catchFault(err *error) {
	r := recover()
	if r == nil {
		return
	}
	e := faultError("connection", r)
	c.faulted.CompareAndSwap(nil, &e)
	*err = *c.faulted.Load()
}

func (c *Conn) pastDeadline(dl *atomic.Int64) error {
	if d := dl.Load(); d != 0 && time.Now().UnixNano() >= d {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// wait waits until ready (or spuriously): it spins, then sets flag and
// sleeps on b until the other end, which clears flag, rings it (park.Wait
// and park.Wake, the flag in the shared region). The caller checks again
// what it waits for.
func (c *Conn) wait(sp *spinner, flag *atomic.Uint32, b *bell, ready func() bool) error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if sp.spin(ready) {
		return nil
	}
	slept := false
	err := park.Wait(flag, ready, func() error {
		slept = true
		return b.wait()
	})
	if !slept {
		return nil
	}
	sp.slept()
	switch {
	case c.closed.Load():
		return net.ErrClosed
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return os.ErrDeadlineExceeded
	default:
		return fmt.Errorf("shm: doorbell: %w", err)
	}
}

// Close closes the rings and the liveness socket, which the peer sees as
// the end of the stream once it has read what was written before. It waits
// for a Read or Write in progress to return, then unmaps the region. It is
// idempotent and returns nil.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.nc.Close()
		c.inData.ring()
		c.outSpace.ring()
		c.reg.closeBells() // also ends a sleep in progress
		c.rmu.Lock()
		c.wmu.Lock()
		<-c.liveDone
		c.reg.unmap()
		if c.release != nil {
			c.release()
		}
		c.wmu.Unlock()
		c.rmu.Unlock()
	})
	return nil
}

// LocalAddr returns the liveness socket's local address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// RemoteAddr returns the liveness socket's remote address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline bounds Reads, as net.Conn's does: past it, Read returns
// os.ErrDeadlineExceeded. The zero time means none.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Store(unixNano(t))
	return c.inData.f.SetReadDeadline(t)
}

// SetWriteDeadline bounds Writes, as net.Conn's does.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(unixNano(t))
	return c.outSpace.f.SetReadDeadline(t)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

// bell is one FIFO of the shared directory: a sleeper reads it, the other
// end writes a byte to wake it. Both ends hold it open read-write, so it
// never reports the end of a stream; the liveness socket does that.
type bell struct {
	f   *os.File
	rc  syscall.RawConn
	buf [64]byte
}

func newBell(f *os.File) (*bell, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &bell{f: f, rc: rc}, nil
}

var wakeByte = []byte{1}

// ring wakes the sleeper, without ever blocking: a full FIFO holds wake-ups
// enough.
func (b *bell) ring() {
	_ = b.rc.Write(func(fd uintptr) bool {
		_, _ = unix.Write(int(fd), wakeByte)
		return true
	})
}

// wait sleeps until the FIFO holds a byte (one ring, or stale ones from
// earlier rings, which make a harmless spurious wake-up), its deadline
// passes or it is closed.
func (b *bell) wait() error {
	_, err := b.f.Read(b.buf[:])
	return err
}

// DefaultSpin is the longest a Read or Write spins before it sleeps when
// Config.Spin is 0 and the fast paths are on (fastpath.Spare: Go runs with
// at least fastpath.MinProcs processors and as many CPUs, or
// TENSORFERRY_FASTPATHS=on): the same as a TCP control connection's read
// spin (wire.DefaultReadSpin). With fewer, a spinning end would take a
// processor that its peer or the goroutines it serves need, and the
// default is not to spin.
const DefaultSpin = wire.DefaultReadSpin

func spinLimit(spin time.Duration) time.Duration {
	switch {
	case spin < 0:
		return 0
	case spin > 0:
		return spin
	default:
		// As a TCP reader's (fastpath.Spare).
		return wire.DefaultReadSpinFor()
	}
}

// spinner decides whether one end spins before it sleeps: a spin of max
// while it pays. Spins are judged by windows of spinWindow waits: when the
// spin ended fewer than half of them (the peer answers later than max, or
// the spin takes the CPU the peer needs to answer), spinning stops; it is
// tried again after probe waits that slept, probe doubling after every
// window that failed (up to maxProbe) and starting again from spinWindow
// after one that passed. A connection whose peer answers within max keeps
// spinning; an idle or slow one, or one on a machine whose CPUs are all
// busy, spends at most a few percent of its waits in a spin.
type spinner struct {
	max, cur    time.Duration // cur: max while spinning, 0 while not
	tries, hits int           // waits spun in this window, and those the spin ended
	idle, probe int           // waits slept since the spin stopped; how many before it is tried again
	sp          park.Spin     // the spin of the wait in progress

	spins  atomic.Uint64 // waits ended by the spin
	sleeps atomic.Uint64 // waits that slept
}

// Windows of the spinner.
const (
	spinWindow = 16
	maxProbe   = 1024
)

func newSpinner(max time.Duration) spinner {
	return spinner{max: max, cur: max, probe: spinWindow}
}

// spin spins until ready or cur has passed (park.Spin); it reports ready.
// Goroutines that became runnable on this processor (an actor the last
// frame woke) run first, once: the one yield of the spin.
func (s *spinner) spin(ready func() bool) bool {
	if s.cur <= 0 {
		return false
	}
	s.sp.Begin(s.cur)
	for first := true; ; first = false {
		if ready() {
			s.spins.Add(1)
			s.judge(true)
			return true
		}
		if !s.sp.Again() {
			s.judge(false)
			return false
		}
		if first {
			runtime.Gosched()
		}
	}
}

// judge counts a spin that ended the wait (hit) or not, and at the end of
// a window decides whether to go on spinning.
func (s *spinner) judge(hit bool) {
	s.tries++
	if hit {
		s.hits++
	}
	if s.tries < spinWindow {
		return
	}
	if 2*s.hits >= s.tries {
		s.probe = spinWindow
	} else {
		s.cur = 0
		s.probe = min(2*s.probe, maxProbe)
	}
	s.tries, s.hits = 0, 0
}

// slept counts a wait that slept; while the spin is off, the probe-th one
// turns it on again for a window.
func (s *spinner) slept() {
	s.sleeps.Add(1)
	if s.max <= 0 || s.cur > 0 {
		return
	}
	if s.idle++; s.idle >= s.probe {
		s.idle = 0
		s.cur = s.max
	}
}

// SpinStats reports, for the reading and the writing side, how many waits
// the spin ended and how many slept.
func (c *Conn) SpinStats() (readSpins, readSleeps, writeSpins, writeSleeps uint64) {
	return c.rspin.spins.Load(), c.rspin.sleeps.Load(), c.wspin.spins.Load(), c.wspin.sleeps.Load()
}
