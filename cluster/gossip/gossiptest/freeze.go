// Package gossiptest helps test and measure package gossip: Freezer, a
// transport wrapper that makes a node stop answering without closing its
// sockets, as a stopped process (SIGSTOP) or a dead host does.
//
//	f := new(gossiptest.Freezer)
//	g, err := gossip.Start(gossip.Config{..., Transport: f.Wrap}, events)
//	...
//	f.Freeze() // the others declare g's node dead within failure detection
package gossiptest

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Freezer wraps a node's gossip transport. Frozen, the node sends nothing,
// drops every packet it receives and leaves every stream opened to it
// unanswered (held open until Thaw or Shutdown), while its sockets stay
// open: to the others it is silent, not gone. Its zero value is ready for
// Wrap; one Freezer wraps one transport.
type Freezer struct {
	inner   memberlist.NodeAwareTransport
	frozen  atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu   sync.Mutex
	held []net.Conn
}

var _ memberlist.NodeAwareTransport = (*Freezer)(nil)

// Wrap wraps t; it is what gossip.Config.Transport takes. It panics if
// called twice.
func (f *Freezer) Wrap(t memberlist.Transport) memberlist.Transport {
	if f.inner != nil {
		panic("gossiptest: Freezer.Wrap called twice")
	}
	na, ok := t.(memberlist.NodeAwareTransport)
	if !ok {
		na = nodeAware{t}
	}
	f.inner = na
	f.packets = make(chan *memberlist.Packet)
	f.streams = make(chan net.Conn)
	f.stop = make(chan struct{})
	f.wg.Add(2)
	go f.forwardPackets()
	go f.forwardStreams()
	return f
}

// Freeze makes the node silent.
func (f *Freezer) Freeze() { f.frozen.Store(true) }

// Thaw makes the node answer again; the streams held while it was frozen
// are closed.
func (f *Freezer) Thaw() {
	f.frozen.Store(false)
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	for _, c := range held {
		c.Close()
	}
}

// Frozen reports whether the node is frozen.
func (f *Freezer) Frozen() bool { return f.frozen.Load() }

func (f *Freezer) forwardPackets() {
	defer f.wg.Done()
	in := f.inner.PacketCh()
	for {
		select {
		case p := <-in:
			if f.frozen.Load() {
				continue
			}
			select {
			case f.packets <- p:
			case <-f.stop:
				return
			}
		case <-f.stop:
			return
		}
	}
}

func (f *Freezer) forwardStreams() {
	defer f.wg.Done()
	in := f.inner.StreamCh()
	for {
		select {
		case c := <-in:
			if f.frozen.Load() {
				f.mu.Lock()
				f.held = append(f.held, c)
				f.mu.Unlock()
				continue
			}
			select {
			case f.streams <- c:
			case <-f.stop:
				c.Close()
				return
			}
		case <-f.stop:
			return
		}
	}
}

// errFrozen is what a frozen node's dials fail with.
var errFrozen = errors.New("gossiptest: node frozen")

func (f *Freezer) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return f.inner.FinalAdvertiseAddr(ip, port)
}

func (f *Freezer) WriteTo(b []byte, addr string) (time.Time, error) {
	if f.frozen.Load() {
		return time.Now(), nil
	}
	return f.inner.WriteTo(b, addr)
}

func (f *Freezer) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	if f.frozen.Load() {
		return time.Now(), nil
	}
	return f.inner.WriteToAddress(b, addr)
}

func (f *Freezer) PacketCh() <-chan *memberlist.Packet { return f.packets }

func (f *Freezer) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if f.frozen.Load() {
		return nil, errFrozen
	}
	return f.inner.DialTimeout(addr, timeout)
}

func (f *Freezer) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if f.frozen.Load() {
		return nil, errFrozen
	}
	return f.inner.DialAddressTimeout(addr, timeout)
}

func (f *Freezer) StreamCh() <-chan net.Conn { return f.streams }

// Shutdown shuts the wrapped transport, closes the held streams and waits
// for the Freezer's goroutines.
func (f *Freezer) Shutdown() error {
	err := f.inner.Shutdown()
	f.once.Do(func() { close(f.stop) })
	f.wg.Wait()
	f.Thaw()
	return err
}

// nodeAware adapts a plain Transport.
type nodeAware struct{ memberlist.Transport }

func (t nodeAware) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t nodeAware) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}
