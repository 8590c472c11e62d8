package wire

import (
	"io"
	"net"
	"syscall"
	"time"

	"github.com/tensorferry/tensorferry/internal/fastpath"
	"github.com/tensorferry/tensorferry/internal/park"
)

// DefaultReadSpin is the read spin (ConnOptions.ReadSpin) a node uses on
// its control connections where the fast paths are on (fastpath.Spare: at
// least fastpath.MinProcs processors and as many CPUs, or
// TENSORFERRY_FASTPATHS=on): long
// enough to catch the reply of a loopback or same-rack round trip that
// follows a frame, short enough to cost little when none comes.
const DefaultReadSpin = 50 * time.Microsecond

// DefaultReadSpinFor returns DefaultReadSpin where the fast paths are on
// by default (fastpath.Spare), and 0 (no spin) otherwise: with fewer
// processors, or GOMAXPROCS set above the CPUs the process may use (8 on
// a 2-core machine), a spinning reader takes a CPU the rest of the
// process needs (a 64-byte round trip took 5× longer there with the spin
// than without).
func DefaultReadSpinFor() time.Duration {
	if fastpath.Spare() {
		return DefaultReadSpin
	}
	return 0
}

// spinReader reads a socket, and when it has nothing to read, polls it
// for up to spin (park.Spin) before parking in the runtime's network
// poller. Waking a goroutine parked there costs a thread wake-up (10–30 µs
// on virtual machines); a reply that comes within the spin is read without
// one. A goroutine the last frame made runnable on this processor is taken
// by one of the idle processors the runtime wakes for it: by default a
// spin needs at least fastpath.MinProcs processors, so there are some.
type spinReader struct {
	raw  syscall.RawConn
	spin time.Duration
	poll func(fd uintptr) bool // r.pollFD, bound once (a closure per Read would allocate)

	// One Read's state, for pollFD: Reads come one at a time (one
	// goroutine holds a connection's read role).
	p    []byte
	n    int
	rerr error
	sp   park.Spin
}

// newSpinReader returns a spinning reader of nc, or nil when nc does not
// expose its file descriptor (TLS, pipes, in-memory networks).
func newSpinReader(nc net.Conn, spin time.Duration) io.Reader {
	if spin <= 0 {
		return nil
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &spinReader{raw: raw, spin: spin}
	r.poll = r.pollFD
	return r
}

func (r *spinReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.p, r.n, r.rerr = p, 0, nil
	r.sp.Begin(r.spin)
	err := r.raw.Read(r.poll)
	n, rerr := r.n, r.rerr
	r.p, r.rerr = nil, nil
	if err != nil {
		return 0, err // closed, or the read deadline passed
	}
	if rerr != nil {
		return 0, rerr
	}
	if n <= 0 {
		return 0, io.EOF
	}
	return n, nil
}

// pollFD is the raw read of Read: it reads until something came or failed
// (true), or the spin is over and the caller is to wait in the poller
// (false; the poller calls it again once the socket is readable).
func (r *spinReader) pollFD(fd uintptr) bool {
	for {
		r.n, r.rerr = syscall.Read(int(fd), r.p)
		switch {
		case r.rerr == syscall.EINTR:
			continue
		case r.rerr != syscall.EAGAIN:
			return true
		case !r.sp.Again():
			return false // wait in the poller
		}
	}
}
