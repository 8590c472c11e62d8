package memnet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"
)

// DefaultBufferSize is what one direction of a connection holds, in bytes,
// before a Write blocks: the part a socket's send and receive buffers
// play, small enough that a stalled link soon blocks its writers.
const DefaultBufferSize = 64 << 10

// Network connects the endpoints of its hosts. Its methods are safe for
// concurrent use.
type Network struct {
	rngMu sync.Mutex
	rng   *rand.Rand

	mu        sync.Mutex
	listeners map[string]*listener
	pipes     map[*pipe]struct{}
	groups    map[string]int // host → partition group (1-based); nil: no partition
	stalls    map[link]bool
	delays    map[link]delay
	resets    map[link]float64
	changed   chan struct{} // closed and replaced when faults change
	ports     int
	bufSize   int
}

// link names the pair of hosts, in either order.
type link struct{ a, b string }

func linkOf(a, b string) link {
	if b < a {
		a, b = b, a
	}
	return link{a, b}
}

type delay struct{ min, max time.Duration }

// New returns a network without faults whose random draws (delays, resets)
// come from a generator seeded with seed.
func New(seed int64) *Network {
	return &Network{
		rng:       rand.New(rand.NewPCG(uint64(seed), uint64(seed)^0x9e3779b97f4a7c15)),
		listeners: map[string]*listener{},
		pipes:     map[*pipe]struct{}{},
		stalls:    map[link]bool{},
		delays:    map[link]delay{},
		resets:    map[link]float64{},
		changed:   make(chan struct{}),
		bufSize:   DefaultBufferSize,
	}
}

// SetBufferSize sets what one direction of a connection dialed from now on
// holds, in bytes, before a Write blocks (DefaultBufferSize at first).
func (n *Network) SetBufferSize(size int) {
	if size < 1 {
		panic("memnet: buffer size below 1")
	}
	n.mu.Lock()
	n.bufSize = size
	n.mu.Unlock()
}

// Host is an endpoint of the network that listens and dials as one named
// host; faults between hosts apply to its connections.
type Host struct {
	n    *Network
	name string
}

// Host returns the endpoint of the host named name. Hosts need no
// declaration; any two calls with one name give the same host.
func (n *Network) Host(name string) *Host { return &Host{n: n, name: name} }

// Name returns the host's name.
func (h *Host) Name() string { return h.name }

// Listen listens as the host named "".
func (n *Network) Listen(address string) (net.Listener, error) { return n.Host("").Listen(address) }

// DialContext dials as the host named "".
func (n *Network) DialContext(ctx context.Context, address string) (net.Conn, error) {
	return n.Host("").DialContext(ctx, address)
}

// Listen listens on address, any string unique in the network. An address
// in use fails with syscall.EADDRINUSE.
func (h *Host) Listen(address string) (net.Listener, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.listeners[address]; ok {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: Addr{h.name, address}, Err: syscall.EADDRINUSE}
	}
	l := &listener{n: n, addr: Addr{h.name, address}, backlog: make(chan *Conn, 128), done: make(chan struct{})}
	n.listeners[address] = l
	return l, nil
}

// DialContext connects to the listener at address. It fails with
// syscall.ECONNREFUSED when nothing listens there or a partition separates
// the two hosts; across a stalled link it waits, as a connect whose
// packets are lost does, until the link heals or ctx is done. ctx bounds
// only the dial, not the connection it returns.
func (h *Host) DialContext(ctx context.Context, address string) (net.Conn, error) {
	n := h.n
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: Addr{Address: address}, Err: err}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, opErr(err)
		}
		n.mu.Lock()
		l, ok := n.listeners[address]
		if !ok || n.partitioned(h.name, l.addr.Host) {
			n.mu.Unlock()
			return nil, opErr(syscall.ECONNREFUSED)
		}
		if n.stalls[linkOf(h.name, l.addr.Host)] {
			changed := n.changed
			n.mu.Unlock()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, opErr(ctx.Err())
			}
		}
		n.ports++
		local := Addr{h.name, fmt.Sprintf("%s#%d", h.name, n.ports)}
		p := newPipe(n, h.name, l.addr.Host, n.bufSize)
		n.pipes[p] = struct{}{}
		n.applyLocked(p)
		n.mu.Unlock()
		client := &Conn{p: p, side: 0, local: local, remote: l.addr, done: make(chan struct{})}
		server := &Conn{p: p, side: 1, local: l.addr, remote: local, done: make(chan struct{})}
		client.init()
		server.init()
		if !l.enqueue(server) {
			p.resetConn()
			return nil, opErr(syscall.ECONNREFUSED)
		}
		return client, nil
	}
}

// partitioned reports whether a partition separates hosts a and b; n.mu is
// held.
func (n *Network) partitioned(a, b string) bool {
	return n.groups != nil && a != b && n.groups[a] != n.groups[b]
}

// Partition splits the hosts into the given groups: dials from one group
// to another are refused, and their open connections stall (bytes wait in
// the buffers) until Heal. Hosts named in no group form one more group
// together. A new Partition replaces the last one.
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	n.groups = map[string]int{}
	for i, g := range groups {
		for _, h := range g {
			n.groups[h] = i + 1
		}
	}
	n.changeLocked()
	n.mu.Unlock()
}

// Stall stops the bytes between hosts a and b, both ways, until Heal: they
// stay in the connections' buffers, writes block once those are full, and
// new dials between the two wait. It is how a link that drops every packet
// looks to a stream: silence, not an error.
func (n *Network) Stall(a, b string) {
	n.mu.Lock()
	n.stalls[linkOf(a, b)] = true
	n.changeLocked()
	n.mu.Unlock()
}

// Cut resets every open connection between hosts a and b: reads and writes
// at both ends fail with syscall.ECONNRESET, and the bytes in flight are
// lost. New dials succeed.
func (n *Network) Cut(a, b string) {
	l := linkOf(a, b)
	n.mu.Lock()
	var cut []*pipe
	for p := range n.pipes {
		if p.link == l {
			cut = append(cut, p)
		}
	}
	n.mu.Unlock()
	for _, p := range cut {
		p.resetConn()
	}
}

// Delay holds each write between hosts a and b for a time drawn uniformly
// from [min, max] before the peer can read it; bytes stay in order (a write
// is never read before an earlier one). Writes do not wait: they return
// once buffered.
func (n *Network) Delay(a, b string, min, max time.Duration) {
	if max < min || min < 0 {
		panic("memnet: bad delay range")
	}
	n.mu.Lock()
	n.delays[linkOf(a, b)] = delay{min, max}
	n.changeLocked()
	n.mu.Unlock()
}

// ResetRate makes each write between hosts a and b reset its connection,
// as Cut does, with probability p: a link that loses a packet now and then
// costs a stream transport its connection.
func (n *Network) ResetRate(a, b string, p float64) {
	n.mu.Lock()
	n.resets[linkOf(a, b)] = p
	n.changeLocked()
	n.mu.Unlock()
}

// Heal removes every fault: partitions, stalls, delays and reset rates.
// Stalled bytes flow again; connections that were reset stay reset.
func (n *Network) Heal() {
	n.mu.Lock()
	n.groups = nil
	clear(n.stalls)
	clear(n.delays)
	clear(n.resets)
	n.changeLocked()
	n.mu.Unlock()
}

// changeLocked applies the faults to every open connection and wakes the
// dials that wait on a stalled link; n.mu is held.
func (n *Network) changeLocked() {
	for p := range n.pipes {
		n.applyLocked(p)
	}
	close(n.changed)
	n.changed = make(chan struct{})
}

// applyLocked sets p's faults from the network's; n.mu is held.
func (n *Network) applyLocked(p *pipe) {
	l := p.link
	p.mu.Lock()
	p.stalled = n.stalls[l] || n.partitioned(l.a, l.b)
	p.delay = n.delays[l]
	p.resetP = n.resets[l]
	p.wakeLocked()
	p.mu.Unlock()
}

// drawDelay draws a delay from d.
func (n *Network) drawDelay(d delay) time.Duration {
	if d.max == 0 {
		return 0
	}
	if d.max == d.min {
		return d.min
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return d.min + time.Duration(n.rng.Int64N(int64(d.max-d.min)+1))
}

// draw reports true with probability p.
func (n *Network) draw(p float64) bool {
	if p <= 0 {
		return false
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64() < p
}

func (n *Network) removePipe(p *pipe) {
	n.mu.Lock()
	delete(n.pipes, p)
	n.mu.Unlock()
}

// network is the name Addr.Network returns.
const network = "memnet"

// Addr is the address of an endpoint: the host it belongs to and the
// address it listens on (or, for a dialer, a name made up for it).
type Addr struct {
	Host    string
	Address string
}

// Network returns "memnet".
func (Addr) Network() string { return network }

// String returns the address.
func (a Addr) String() string { return a.Address }

type listener struct {
	n       *Network
	addr    Addr
	backlog chan *Conn
	done    chan struct{}

	mu     sync.Mutex
	closed bool
}

// enqueue queues c for Accept; it fails when the listener is closed or its
// backlog is full (a dial is refused then, as by a real listener whose
// queue overflows).
func (l *listener) enqueue(c *Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	select {
	case l.backlog <- c:
		return true
	default:
		return false
	}
}

// Accept waits for the next connection; after Close it returns an error
// matching net.ErrClosed.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.backlog:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: network, Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close frees the address and resets the connections not accepted yet.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return &net.OpError{Op: "close", Net: network, Addr: l.addr, Err: net.ErrClosed}
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.n.mu.Lock()
	if l.n.listeners[l.addr.Address] == l {
		delete(l.n.listeners, l.addr.Address)
	}
	l.n.mu.Unlock()
	for {
		select {
		case c := <-l.backlog:
			c.p.resetConn()
		default:
			return nil
		}
	}
}

func (l *listener) Addr() net.Addr { return l.addr }
