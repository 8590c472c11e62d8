//go:build linux

package wire

import (
	"encoding/binary"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/internal/park"
	"golang.org/x/sys/unix"
)

// maxDetached is the most control connections of a process that a read
// spin takes out of the Go runtime's network poller (detachedConn), 128;
// tests lower it. Each one, while idle, holds a thread blocked in poll(2);
// the connections beyond spin through the poller (spinReader).
var maxDetached = 128

// detachedConns counts the detached connections of the process.
var detachedConns atomic.Int32

// detachedConn is a TCP control connection whose read spins (ReadSpin) and
// that Conn.Start takes out of the Go runtime's network poller: from then
// on it reads and writes its own duplicate of the socket with system calls
// of its own, and waits in poll(2) once the spin is over.
//
// Why: a socket in the runtime's poller is in its epoll set, and every
// segment that reaches it wakes the thread that waits in epoll_wait for
// the idle processors, although the spinning reader takes the bytes
// itself. The peer's write pays for that wake-up: on a 16-core H100 host a
// 64-byte round trip over loopback TCP with both ends spinning took about
// 1.6 µs less out of the poller than in it (BENCHMARKS.md, "The read spin
// out of the runtime's poller").
//
// Before Start, and when the process already has maxDetached, it is
// the TCP connection with a spinReader.
type detachedConn struct {
	tc       *net.TCPConn
	fallback io.Reader // tc's spinning reader, while not detached
	spin     time.Duration
	on       atomic.Bool // detached: fd and wake are in use, tc is closed

	fd, wake int // the socket's duplicate (non-blocking) and an eventfd that ends a read's wait
	// mu is held shared while a call uses fd or wake, and exclusively by
	// Close to close them.
	mu     sync.RWMutex
	closed atomic.Bool
	rdl    atomic.Int64 // read deadline, Unix ns; 0: none
	wdl    atomic.Int64 // write deadline, Unix ns; 0: none

	rpoll [2]unix.PollFd // Read's (one Read at a time)
	rbuf  [8]byte        // Read's, to drain wake
	rspin park.Spin      // Read's
}

var _ InterruptibleReader = (*detachedConn)(nil)

// newDetachable returns nc as a detachedConn when its read spins and it is
// a plain TCP connection; nil otherwise.
func newDetachable(nc net.Conn, spin time.Duration) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok || spin <= 0 {
		return nil
	}
	fb := newSpinReader(tc, spin)
	if fb == nil {
		return nil
	}
	return &detachedConn{tc: tc, fallback: fb, spin: spin, fd: -1, wake: -1}
}

// detachOnStart detaches nc if it is a detachedConn; Conn.Start calls it
// before the Conn's goroutines start.
func detachOnStart(nc net.Conn) {
	if dc, ok := nc.(*detachedConn); ok {
		dc.detach()
	}
}

// detach takes the socket out of the runtime's poller: it duplicates the
// descriptor and closes tc (whose close removes it from the epoll set).
// It is called once, before the Conn's goroutines start and before any
// Close. When it cannot (maxDetached, or a system call failed), the
// connection stays in the poller.
func (d *detachedConn) detach() {
	if detachedConns.Add(1) > int32(maxDetached) {
		detachedConns.Add(-1)
		return
	}
	raw, err := d.tc.SyscallConn()
	fd := -1
	if err == nil {
		err = raw.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	}
	var wake int
	if err == nil {
		if err = unix.SetNonblock(fd, true); err == nil {
			wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		}
	}
	if err != nil {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		detachedConns.Add(-1)
		return
	}
	d.fd, d.wake = fd, wake
	d.rpoll = [2]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
	d.on.Store(true)
	_ = d.tc.Close()
}

// InterruptibleReads implements InterruptibleReader: a read deadline set
// in the past ends a waiting Read.
func (d *detachedConn) InterruptibleReads() {}

func (d *detachedConn) Read(p []byte) (int, error) {
	if !d.on.Load() {
		return d.fallback.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	d.rspin.Begin(d.spin)
	for {
		if d.closed.Load() {
			return 0, net.ErrClosed
		}
		n, err := unix.Read(d.fd, p)
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return 0, os.NewSyscallError("read", err)
		}
		// A deadline (a wake-up sets one in the past) is checked at every
		// empty read.
		dl := d.rdl.Load()
		if dl != 0 && time.Now().UnixNano() >= dl {
			return 0, os.ErrDeadlineExceeded
		}
		if d.rspin.Again() {
			continue
		}
		if _, err := unix.Poll(d.rpoll[:], pollTimeout(dl, time.Now())); err != nil && err != unix.EINTR {
			return 0, os.NewSyscallError("poll", err)
		}
		if d.rpoll[1].Revents != 0 {
			_, _ = unix.Read(d.wake, d.rbuf[:]) // a deadline changed, or Close
		}
	}
}

func (d *detachedConn) Write(p []byte) (int, error) {
	if !d.on.Load() {
		return d.tc.Write(p)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	var pfd [1]unix.PollFd
	done := 0
	for done < len(p) {
		if d.closed.Load() {
			return done, net.ErrClosed
		}
		n, err := unix.Write(d.fd, p[done:])
		if n > 0 {
			done += n
		}
		switch {
		case err == nil || err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return done, os.NewSyscallError("write", err)
		}
		// The socket's buffer is full: wait until it drains, in steps
		// short enough to notice a new deadline (Close shuts the socket
		// down, which ends the wait at once).
		now := time.Now()
		dl := d.wdl.Load()
		if dl != 0 && now.UnixNano() >= dl {
			return done, os.ErrDeadlineExceeded
		}
		timeout := pollTimeout(dl, now)
		if timeout < 0 || timeout > 10 {
			timeout = 10
		}
		pfd[0] = unix.PollFd{Fd: int32(d.fd), Events: unix.POLLOUT}
		if _, err := unix.Poll(pfd[:], timeout); err != nil && err != unix.EINTR {
			return done, os.NewSyscallError("poll", err)
		}
	}
	return done, nil
}

// maxPollTimeout bounds one wait for a deadline (ms): the wait is redone
// until the deadline, and a far one (years ahead) would overflow poll's
// timeout.
const maxPollTimeout = 3600 * 1000

// pollTimeout is poll(2)'s timeout in ms until deadline dl (Unix ns; 0:
// none, -1), rounded up, at most maxPollTimeout.
func pollTimeout(dl int64, now time.Time) int {
	if dl == 0 {
		return -1
	}
	ms := (dl - now.UnixNano() + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	return int(min(max(ms, 0), maxPollTimeout))
}

// Close shuts the socket down, which ends a Read or Write waiting in
// poll, waits until they have left and closes the descriptors.
func (d *detachedConn) Close() error {
	if !d.on.Load() {
		return d.tc.Close()
	}
	if d.closed.Swap(true) {
		return net.ErrClosed
	}
	_ = unix.Shutdown(d.fd, unix.SHUT_RDWR)
	d.signal()
	d.mu.Lock()
	err := unix.Close(d.fd)
	_ = unix.Close(d.wake)
	d.fd, d.wake = -1, -1
	d.mu.Unlock()
	detachedConns.Add(-1)
	if err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

// signal ends a Read's wait in poll, so that it looks at its deadline
// again; the caller holds mu (either way) or is Close.
func (d *detachedConn) signal() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(d.wake, one[:])
}

func (d *detachedConn) LocalAddr() net.Addr  { return d.tc.LocalAddr() }
func (d *detachedConn) RemoteAddr() net.Addr { return d.tc.RemoteAddr() }

func (d *detachedConn) SetDeadline(t time.Time) error {
	if err := d.SetReadDeadline(t); err != nil {
		return err
	}
	return d.SetWriteDeadline(t)
}

func (d *detachedConn) SetReadDeadline(t time.Time) error {
	d.rdl.Store(unixNano(t))
	if !d.on.Load() {
		return d.tc.SetReadDeadline(t)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return net.ErrClosed
	}
	d.signal()
	return nil
}

func (d *detachedConn) SetWriteDeadline(t time.Time) error {
	d.wdl.Store(unixNano(t))
	if !d.on.Load() {
		return d.tc.SetWriteDeadline(t)
	}
	if d.closed.Load() {
		return net.ErrClosed
	}
	return nil
}

// unixNano is t in Unix ns, 0 for the zero time (no deadline), at least 1
// for any other and math.MaxInt64 for one past what int64 ns can hold
// (t.UnixNano would overflow).
func unixNano(t time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case t.After(lastUnixNano):
		return math.MaxInt64
	case t.Before(firstUnixNano):
		return 1
	}
	return max(t.UnixNano(), 1)
}

var (
	firstUnixNano = time.Unix(0, 1)
	lastUnixNano  = time.Unix(0, math.MaxInt64)
)
