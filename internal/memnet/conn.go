package memnet

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// pipe is the state of one connection: two buffered directions (0: from the
// dialer, 1: to it) and the faults on its link.
type pipe struct {
	n    *Network
	link link

	mu      sync.Mutex
	wake    chan struct{} // closed and replaced on every change
	dir     [2]direction  // dir[i]: bytes written by side i
	size    int           // what one direction holds before a Write blocks
	reset   bool
	stalled bool
	delay   delay
	resetP  float64
	closed  [2]bool
}

// direction is the bytes one side wrote that the other has not read.
type direction struct {
	segs   []segment
	n      int       // bytes in segs
	lastAt time.Time // when the last segment becomes readable
	eof    bool      // the writer closed: EOF once segs are read
}

// segment is the bytes of one write, readable from at.
type segment struct {
	b  []byte
	at time.Time
}

func newPipe(n *Network, a, b string, size int) *pipe {
	return &pipe{n: n, link: linkOf(a, b), wake: make(chan struct{}), size: size}
}

// wakeLocked wakes every reader and writer waiting on p; p.mu is held.
func (p *pipe) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// resetConn resets the connection: both ends fail with ECONNRESET.
func (p *pipe) resetConn() {
	p.mu.Lock()
	p.reset = true
	p.dir = [2]direction{}
	p.wakeLocked()
	p.mu.Unlock()
	p.n.removePipe(p)
}

// Conn is one end of a connection. It implements net.Conn.
type Conn struct {
	p             *pipe
	side          int // index of the direction this end writes
	local, remote Addr
	done          chan struct{} // closed by Close
	once          sync.Once
	rd, wd        deadline
}

var _ net.Conn = (*Conn)(nil)

func (c *Conn) init() {
	c.rd.init()
	c.wd.init()
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: network, Source: c.local, Addr: c.remote, Err: err}
}

// Read reads the bytes the peer wrote, in order, once their delay has
// passed and while the link is not stalled. It returns io.EOF after the
// peer's Close once every byte is read, an error matching net.ErrClosed
// after this end's Close, syscall.ECONNRESET after a reset, and
// os.ErrDeadlineExceeded past the read deadline.
func (c *Conn) Read(b []byte) (int, error) {
	p := c.p
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-c.done:
			return 0, c.opError("read", net.ErrClosed)
		default:
		}
		p.mu.Lock()
		if p.reset {
			p.mu.Unlock()
			return 0, c.opError("read", syscall.ECONNRESET)
		}
		if c.rd.expired() {
			p.mu.Unlock()
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			p.mu.Unlock()
			return 0, nil
		}
		d := &p.dir[1-c.side]
		var ready <-chan time.Time
		if !p.stalled {
			if len(d.segs) > 0 {
				s := &d.segs[0]
				if wait := time.Until(s.at); wait <= 0 {
					k := copy(b, s.b)
					s.b = s.b[k:]
					d.n -= k
					if len(s.b) == 0 {
						d.segs[0] = segment{}
						d.segs = d.segs[1:]
					}
					p.wakeLocked()
					p.mu.Unlock()
					return k, nil
				} else {
					if timer == nil {
						timer = time.NewTimer(wait)
					} else {
						timer.Reset(wait)
					}
					ready = timer.C
				}
			} else if d.eof {
				p.mu.Unlock()
				return 0, io.EOF
			}
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ready:
		case <-c.rd.wait():
		case <-c.done:
		}
	}
}

// Write writes b for the peer, blocking while the direction's buffer is
// full. It returns an error matching net.ErrClosed after this end's Close,
// syscall.EPIPE after the peer's, syscall.ECONNRESET after a reset, and
// os.ErrDeadlineExceeded past the write deadline, with the count of bytes
// written before.
func (c *Conn) Write(b []byte) (int, error) {
	p := c.p
	if len(b) > 0 && p.n.draw(c.resetRate()) {
		p.resetConn()
	}
	written := 0
	for {
		select {
		case <-c.done:
			return written, c.opError("write", net.ErrClosed)
		default:
		}
		p.mu.Lock()
		if written > 0 && written == len(b) {
			// Every byte was queued for the peer: a close after that
			// does not make this write fail.
			p.mu.Unlock()
			return written, nil
		}
		switch {
		case p.reset:
			p.mu.Unlock()
			return written, c.opError("write", syscall.ECONNRESET)
		case p.closed[1-c.side]:
			p.mu.Unlock()
			return written, c.opError("write", syscall.EPIPE)
		case c.wd.expired():
			p.mu.Unlock()
			return written, c.opError("write", os.ErrDeadlineExceeded)
		}
		if written == len(b) {
			p.mu.Unlock()
			return written, nil
		}
		d := &p.dir[c.side]
		if space := p.size - d.n; space > 0 {
			k := min(space, len(b)-written)
			at := time.Now().Add(p.n.drawDelay(p.delay))
			if at.Before(d.lastAt) {
				at = d.lastAt // never before an earlier write
			}
			d.lastAt = at
			d.segs = append(d.segs, segment{b: append([]byte(nil), b[written:written+k]...), at: at})
			d.n += k
			written += k
			p.wakeLocked()
			p.mu.Unlock()
			continue
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-c.wd.wait():
		case <-c.done:
		}
	}
}

func (c *Conn) resetRate() float64 {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.p.resetP
}

// Close closes this end: its Read and Write fail with net.ErrClosed, and
// the peer reads io.EOF after the bytes already written. A second Close
// returns an error matching net.ErrClosed.
func (c *Conn) Close() error {
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	close(c.done)
	p := c.p
	p.mu.Lock()
	p.closed[c.side] = true
	p.dir[c.side].eof = true
	p.dir[1-c.side] = direction{} // unread bytes are dropped
	both := p.closed[0] && p.closed[1]
	p.wakeLocked()
	p.mu.Unlock()
	if both {
		p.n.removePipe(p)
	}
	return nil
}

// LocalAddr returns this end's address, an Addr.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address, an Addr.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// InterruptibleReads marks a Conn as a wire.InterruptibleReader: a read
// deadline set in the past from another goroutine ends a Read that waits
// for bytes with os.ErrDeadlineExceeded, nothing read and nothing lost. So
// a caller waiting for its reply may take over a memnet connection's
// reading (wire.Conn.Await), as over a socket: tests over memnet run the
// read role too.
func (c *Conn) InterruptibleReads() {}

// SetDeadline sets the read and write deadlines; the zero time clears them.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

// SetReadDeadline sets the read deadline; the zero time clears it. It
// applies to a Read already waiting.
func (c *Conn) SetReadDeadline(t time.Time) error { c.rd.set(t); return nil }

// SetWriteDeadline sets the write deadline; the zero time clears it. It
// applies to a Write already waiting.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// deadline is a settable deadline whose expiry closes a channel.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
}

func (d *deadline) init() { d.cancel = make(chan struct{}) }

// set sets the deadline to t; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired (or is firing): wait for it to close cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// wait returns a channel closed when the deadline passes.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func (d *deadline) expired() bool { return isClosed(d.wait()) }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
