package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The raw-tcp-spin paths are raw TCP round trips (no framing, like
// raw-tcp) whose two ends read with a spin, as tensorferry's control
// connections do on hosts with idle cores (wire.ConnOptions.ReadSpin):
// they isolate what the way of spinning costs from the runtime above it.
//
//   - raw-tcp-spin: both sockets stay in the Go runtime's network poller;
//     a read that finds nothing retries for up to rawSpin, then parks
//     there (what wire's spinReader does).
//   - raw-tcp-spin-detached: both sockets are duplicated out of the poller
//     (the net.Conn closed, which removes it from the epoll set); a read
//     retries for up to rawSpin, then waits in poll(2) (what wire's
//     detachedConn does).
//   - raw-tcp-wait-detached: as raw-tcp-spin-detached without the spin: a
//     read that finds nothing waits in poll(2) at once, its thread asleep
//     in the kernel until the socket is readable.
//   - raw-tcp-pollspin-detached: as raw-tcp-spin-detached, spinning on
//     poll(2) with a zero timeout instead of read(2): TCP's poll reads the
//     socket's state without its lock, which read(2) takes, so the spin
//     does not contend with the kernel delivering the data.
func init() {
	extraPaths = append(extraPaths,
		path{name: "raw-tcp-spin", rttOnly: true, open: func() (*endpoints, error) { return openRawSpin(false, rawSpin, 0) }},
		path{name: "raw-tcp-spin-detached", rttOnly: true, open: func() (*endpoints, error) { return openRawSpin(true, rawSpin, 0) }},
		path{name: "raw-tcp-wait-detached", rttOnly: true, open: func() (*endpoints, error) { return openRawSpin(true, 0, 0) }},
		path{name: "raw-tcp-pollspin-detached", rttOnly: true, open: func() (*endpoints, error) { return openRawSpin(true, -rawSpin, 0) }})
	for _, pause := range []time.Duration{250 * time.Nanosecond, time.Microsecond} {
		extraPaths = append(extraPaths, path{name: fmt.Sprintf("raw-tcp-spin-detached-pause-%dns", pause.Nanoseconds()), rttOnly: true,
			open: func() (*endpoints, error) { return openRawSpin(true, rawSpin, pause) }})
	}
}

// rawSpin is the spin of the raw-tcp-spin paths: wire.DefaultReadSpin.
const rawSpin = 50 * time.Microsecond

// spinSocket is one end of a raw-tcp-spin connection.
type spinSocket interface {
	readFull(p []byte) error
	writeAll(p []byte) error
	close() error
}

type rawSpinPath struct {
	client, server spinSocket
	done           chan struct{}
	req, resp      [payloadSize]byte
}

// openRawSpin opens a raw-tcp-spin path: detached or in the poller, with
// the detached sockets' spin and pause (detachedSocket).
func openRawSpin(detach bool, spin, pause time.Duration) (*endpoints, error) {
	c, s, err := loopbackPair()
	if err != nil {
		return nil, err
	}
	p := &rawSpinPath{done: make(chan struct{})}
	for i := range p.req {
		p.req[i] = byte(i)
	}
	if detach {
		if p.client, err = newDetachedSocket(c, spin, pause); err == nil {
			if p.server, err = newDetachedSocket(s, spin, pause); err != nil {
				_ = p.client.close()
			}
		}
		if err != nil {
			c.Close()
			s.Close()
			return nil, err
		}
	} else {
		if p.client, err = newPollerSocket(c); err == nil {
			p.server, err = newPollerSocket(s)
		}
		if err != nil {
			c.Close()
			s.Close()
			return nil, err
		}
	}
	go p.serve()
	return &endpoints{pinger: p, close: p.close}, nil
}

// loopbackPair returns both ends of a loopback TCP connection with
// TCP_NODELAY.
func loopbackPair() (net.Conn, net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	a := <-ch
	if err != nil || a.err != nil {
		if c != nil {
			c.Close()
		}
		if a.c != nil {
			a.c.Close()
		}
		return nil, nil, errors.Join(err, a.err)
	}
	c.(*net.TCPConn).SetNoDelay(true)
	a.c.(*net.TCPConn).SetNoDelay(true)
	return c, a.c, nil
}

// serve echoes until the connection closes.
func (p *rawSpinPath) serve() {
	defer close(p.done)
	var buf [payloadSize]byte
	for {
		if p.server.readFull(buf[:]) != nil || p.server.writeAll(buf[:]) != nil {
			return
		}
	}
}

// RoundTrip writes one request and reads the echoed response.
func (p *rawSpinPath) RoundTrip() error {
	if err := p.client.writeAll(p.req[:]); err != nil {
		return err
	}
	if err := p.client.readFull(p.resp[:]); err != nil {
		return err
	}
	if p.resp != p.req {
		return errors.New("raw-tcp-spin: response differs from request")
	}
	return nil
}

func (p *rawSpinPath) close() error {
	err := p.client.close()
	<-p.done // the server reads EOF
	return errors.Join(err, p.server.close())
}

// pollerSocket spins on read(2) through the socket's RawConn, then parks in
// the runtime's poller.
type pollerSocket struct {
	c   net.Conn
	raw syscall.RawConn
}

func newPollerSocket(c net.Conn) (*pollerSocket, error) {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return nil, err
	}
	return &pollerSocket{c: c, raw: raw}, nil
}

func (s *pollerSocket) readFull(p []byte) error {
	for got := 0; got < len(p); {
		var start time.Time
		var n int
		var rerr error
		err := s.raw.Read(func(fd uintptr) bool {
			for {
				n, rerr = syscall.Read(int(fd), p[got:])
				if rerr != syscall.EAGAIN && rerr != syscall.EINTR {
					return true
				}
				if start.IsZero() {
					start = time.Now()
				} else if time.Since(start) > rawSpin {
					return false // park in the poller
				}
			}
		})
		switch {
		case err != nil:
			return err
		case rerr != nil:
			return rerr
		case n == 0:
			return io.EOF
		}
		got += n
	}
	return nil
}

func (s *pollerSocket) writeAll(p []byte) error {
	_, err := s.c.Write(p)
	return err
}

func (s *pollerSocket) close() error { return s.c.Close() }

// detachedSocket is a duplicate of a socket out of the runtime's poller:
// it spins on read(2) for up to spin, then waits in poll(2). A negative
// spin spins as long on poll(2) with a zero timeout, reading once the
// socket is readable.
type detachedSocket struct {
	fd    int
	spin  time.Duration
	pause time.Duration // between the spin's reads, without a system call
	pfd   [1]unix.PollFd
	mu    sync.Mutex // close vs. a shutdown already done
}

func newDetachedSocket(c net.Conn, spin, pause time.Duration) (*detachedSocket, error) {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	cerr := raw.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	if err = errors.Join(cerr, err); err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	c.Close() // out of the epoll set; the socket lives on in fd
	return &detachedSocket{fd: fd, spin: spin, pause: pause, pfd: [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}}, nil
}

func (s *detachedSocket) readFull(p []byte) error {
	var start time.Time
	for got := 0; got < len(p); {
		n, err := unix.Read(s.fd, p[got:])
		switch {
		case err == unix.EAGAIN:
			if s.spin < 0 {
				s.pollSpin(-s.spin)
				continue
			}
			if s.pause > 0 {
				for t0 := time.Now(); time.Since(t0) < s.pause; {
				}
			}
			if s.spin > 0 && start.IsZero() {
				start = time.Now()
			} else if s.spin == 0 || time.Since(start) > s.spin {
				if _, err := unix.Poll(s.pfd[:], -1); err != nil && err != unix.EINTR {
					return err
				}
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.EOF
		}
		got += n
	}
	return nil
}

// pollSpin returns once the socket is readable (or has an error or
// hung up): it polls without waiting for up to spin, then waits.
func (s *detachedSocket) pollSpin(spin time.Duration) {
	start := time.Now()
	for i := 0; ; i++ {
		n, err := unix.Poll(s.pfd[:], 0)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
		if i&7 == 7 && time.Since(start) > spin {
			_, _ = unix.Poll(s.pfd[:], -1)
			return
		}
	}
}

func (s *detachedSocket) writeAll(p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(s.fd, p)
		switch {
		case err == unix.EAGAIN:
			pfd := [1]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
			if _, err := unix.Poll(pfd[:], -1); err != nil && err != unix.EINTR {
				return err
			}
			continue
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		}
		p = p[n:]
	}
	return nil
}

// close shuts the socket down (which ends the other end's wait with EOF)
// and closes it.
func (s *detachedSocket) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	_ = unix.Shutdown(s.fd, unix.SHUT_RDWR)
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}
