package gossip

import (
	"errors"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport is the transport closest to the network: memberlist's
// NetTransport, counting what goes through it (Stats) and closing every
// stream at Shutdown, so that no goroutine of memberlist stays blocked on
// one.
type countingTransport struct {
	inner *memberlist.NetTransport

	packetsSent, packetsRecv         atomic.Uint64
	packetBytesSent, packetBytesRecv atomic.Uint64
	streamsDialed, streamsAcc        atomic.Uint64
	streamBytesSent                  atomic.Uint64
	streamBytesRecv                  atomic.Uint64

	packets chan *memberlist.Packet
	streams chan net.Conn

	mu     sync.Mutex
	conns  map[*countingConn]struct{}
	closed bool

	stop chan struct{}
	wg   sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

// bindAttempts bounds the retries of a bind to port 0: the kernel picks a
// free TCP port, whose UDP twin may be taken.
const bindAttempts = 10

// newCountingTransport binds TCP and UDP on ip:port (port 0: one the kernel
// picks, free for both).
func newCountingTransport(ip net.IP, port int, logger *log.Logger) (*countingTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{ip.String()}, BindPort: port, Logger: logger}
	attempts := 1
	if port == 0 {
		attempts = bindAttempts
	}
	var (
		nt  *memberlist.NetTransport
		err error
	)
	for range attempts {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gossip: listen on %s: %w", net.JoinHostPort(ip.String(), fmt.Sprint(port)), err)
	}
	t := &countingTransport{
		inner:   nt,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		conns:   make(map[*countingConn]struct{}),
		stop:    make(chan struct{}),
	}
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t, nil
}

func (t *countingTransport) forwardPackets() {
	defer t.wg.Done()
	in := t.inner.PacketCh()
	for {
		select {
		case p := <-in:
			t.packetsRecv.Add(1)
			t.packetBytesRecv.Add(uint64(len(p.Buf)))
			select {
			case t.packets <- p:
			case <-t.stop:
				return
			}
		case <-t.stop:
			return
		}
	}
}

func (t *countingTransport) forwardStreams() {
	defer t.wg.Done()
	in := t.inner.StreamCh()
	for {
		select {
		case c := <-in:
			t.streamsAcc.Add(1)
			cc, ok := t.track(c)
			if !ok {
				continue
			}
			select {
			case t.streams <- cc:
			case <-t.stop:
				cc.Close()
				return
			}
		case <-t.stop:
			return
		}
	}
}

// track wraps c to count its bytes and close it at Shutdown; after
// Shutdown it closes c and reports false.
func (t *countingTransport) track(c net.Conn) (*countingConn, bool) {
	cc := &countingConn{Conn: c, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, false
	}
	t.conns[cc] = struct{}{}
	return cc, true
}

func (t *countingTransport) untrack(cc *countingConn) {
	t.mu.Lock()
	delete(t.conns, cc)
	t.mu.Unlock()
}

// Port is the port the transport is bound to, UDP and TCP.
func (t *countingTransport) Port() int { return t.inner.GetAutoBindPort() }

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *countingTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	ts, err := t.inner.WriteToAddress(b, addr)
	if err == nil {
		t.packetsSent.Add(1)
		t.packetBytesSent.Add(uint64(len(b)))
	}
	return ts, err
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// errClosed is returned by a dial after Shutdown.
var errClosed = errors.New("gossip: transport closed")

func (t *countingTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.inner.DialAddressTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	t.streamsDialed.Add(1)
	cc, ok := t.track(c)
	if !ok {
		return nil, errClosed
	}
	return cc, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the listeners, every stream, and waits for the
// forwarding goroutines and the listeners' goroutines.
func (t *countingTransport) Shutdown() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	err := t.inner.Shutdown()
	close(t.stop)
	for c := range conns {
		c.Conn.Close()
	}
	t.wg.Wait()
	return err
}

// countingConn counts the bytes of one stream.
type countingConn struct {
	net.Conn
	t    *countingTransport
	once sync.Once
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.t.streamBytesRecv.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.t.streamBytesSent.Add(uint64(n))
	return n, err
}

func (c *countingConn) Close() error {
	c.once.Do(func() { c.t.untrack(c) })
	return c.Conn.Close()
}
