package gossip

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// netTransport is memberlist's transport over UDP and TCP on one port,
// in place of memberlist.NetTransport: it counts what goes through it
// (Stats), closes every stream at Shutdown so that no goroutine stays
// blocked on one, and hands memberlist each packet in a buffer of its own
// size (NetTransport allocates 64 KiB per packet, garbage that dominates
// the collector's work in a process of many nodes).
type netTransport struct {
	tcp    *net.TCPListener
	udp    *net.UDPConn
	port   int
	logger *log.Logger

	packetsSent, packetsRecv         atomic.Uint64
	packetBytesSent, packetBytesRecv atomic.Uint64
	streamsDialed, streamsAcc        atomic.Uint64
	streamBytesSent, streamBytesRecv atomic.Uint64
	// inbound counts the accepted streams open now; streamsRefused those
	// closed at once because maxInboundStreams were.
	inbound        atomic.Int64
	streamsRefused atomic.Uint64

	packets chan *memberlist.Packet
	streams chan net.Conn

	mu     sync.Mutex
	conns  map[*countingConn]struct{}
	closed bool

	stop chan struct{}
	wg   sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*netTransport)(nil)

const (
	// bindAttempts bounds the retries of a bind to port 0: the kernel
	// picks a free TCP port, whose UDP twin may be taken.
	bindAttempts = 10
	// maxPacket is the largest UDP payload.
	maxPacket = 65535
	// udpRecvBuf is the socket receive buffer asked for (the kernel may
	// give less): room for bursts of gossip while the reader is busy.
	udpRecvBuf = 2 << 20
	// maxInboundStreams bounds the accepted streams open at once. A
	// stream is authenticated only once memberlist has read and
	// decrypted all of it, so until then every stream is an outsider's:
	// one over the bound is closed at once.
	maxInboundStreams = 32
	// maxStreamBytes bounds what one accepted stream may send: memberlist
	// buffers an encrypted message whole (up to 20 MiB) before it can
	// check it. A push/pull of 256 nodes' state is tens of KiB.
	maxStreamBytes = 1 << 20
)

// errStreamTooLong ends the read of an accepted stream past maxStreamBytes.
var errStreamTooLong = fmt.Errorf("gossip: stream longer than %d bytes", maxStreamBytes)

// listen binds TCP and UDP on ip:port (port 0: one the kernel picks, free
// for both).
func listen(ip net.IP, port int, logger *log.Logger) (*netTransport, error) {
	attempts := 1
	if port == 0 {
		attempts = bindAttempts
	}
	var err error
	for range attempts {
		var t *netTransport
		if t, err = bind(ip, port); err == nil {
			t.logger = logger
			t.packets = make(chan *memberlist.Packet)
			t.streams = make(chan net.Conn)
			t.conns = make(map[*countingConn]struct{})
			t.stop = make(chan struct{})
			t.wg.Add(2)
			go t.readPackets()
			go t.accept()
			return t, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("gossip: listen on %s: %w", net.JoinHostPort(ip.String(), strconv.Itoa(port)), err)
}

func bind(ip net.IP, port int) (*netTransport, error) {
	tl, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, err
	}
	port = tl.Addr().(*net.TCPAddr).Port
	ul, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		tl.Close()
		return nil, err
	}
	for size := udpRecvBuf; size > 0; size /= 2 {
		if ul.SetReadBuffer(size) == nil {
			break
		}
	}
	return &netTransport{tcp: tl, udp: ul, port: port}, nil
}

// readPackets hands memberlist each packet in a buffer of its size.
func (t *netTransport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		now := time.Now()
		if err != nil {
			if t.isClosed() {
				return
			}
			t.logger.Printf("[ERR] memberlist: Error reading UDP packet: %v", err)
			continue
		}
		if n == 0 {
			continue
		}
		t.packetsRecv.Add(1)
		t.packetBytesRecv.Add(uint64(n))
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: net.UDPAddrFromAddrPort(from), Timestamp: now}
		select {
		case t.packets <- p:
		case <-t.stop:
			return
		}
	}
}

// accept hands memberlist each stream, backing off on errors as
// NetTransport does.
func (t *netTransport) accept() {
	defer t.wg.Done()
	const baseDelay, maxDelay = 5 * time.Millisecond, time.Second
	var delay time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.isClosed() {
				return
			}
			delay = min(max(2*delay, baseDelay), maxDelay)
			t.logger.Printf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			select {
			case <-time.After(delay):
			case <-t.stop:
				return
			}
			continue
		}
		delay = 0
		t.streamsAcc.Add(1)
		if t.inbound.Add(1) > maxInboundStreams {
			t.inbound.Add(-1)
			t.streamsRefused.Add(1)
			c.Close()
			continue
		}
		cc, ok := t.track(c)
		if !ok {
			t.inbound.Add(-1)
			return
		}
		cc.inbound, cc.left = true, maxStreamBytes
		select {
		case t.streams <- cc:
		case <-t.stop:
			cc.Close()
			return
		}
	}
}

func (t *netTransport) isClosed() bool {
	select {
	case <-t.stop:
		return true
	default:
		return false
	}
}

// track wraps c to count its bytes and close it at Shutdown; after
// Shutdown it closes c and reports false.
func (t *netTransport) track(c net.Conn) (*countingConn, bool) {
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

func (t *netTransport) untrack(cc *countingConn) {
	t.mu.Lock()
	delete(t.conns, cc)
	t.mu.Unlock()
}

// FinalAdvertiseAddr returns ip:port when given, else the bound address,
// or a private IP of the host when bound to every interface.
func (t *netTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("gossip: bad advertise address %q", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	a := t.tcp.Addr().(*net.TCPAddr).IP
	if a.IsUnspecified() {
		s, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("gossip: bound to every interface: find a private IP to advertise: %w", err)
		}
		if a = net.ParseIP(s); a == nil {
			return nil, 0, errors.New("gossip: bound to every interface and no private IP to advertise: bind one address")
		}
	}
	if a4 := a.To4(); a4 != nil {
		a = a4
	}
	return a, t.port, nil
}

func (t *netTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *netTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	ap, err := netip.ParseAddrPort(addr.Addr)
	if err != nil {
		ua, rerr := net.ResolveUDPAddr("udp", addr.Addr)
		if rerr != nil {
			return time.Time{}, rerr
		}
		ap = ua.AddrPort()
	}
	if _, err := t.udp.WriteToUDPAddrPort(b, ap); err != nil {
		return time.Time{}, err
	}
	t.packetsSent.Add(1)
	t.packetBytesSent.Add(uint64(len(b)))
	return time.Now(), nil
}

func (t *netTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *netTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// errClosed is returned by a dial after Shutdown.
var errClosed = errors.New("gossip: transport closed")

func (t *netTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr.Addr, timeout)
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

func (t *netTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the sockets and every stream, and waits for the
// transport's goroutines.
func (t *netTransport) Shutdown() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	close(t.stop)
	err := errors.Join(t.tcp.Close(), t.udp.Close())
	for c := range conns {
		c.Conn.Close()
	}
	t.wg.Wait()
	return err
}

// countingConn counts the bytes of one stream; an accepted (inbound) one
// may read at most maxStreamBytes.
type countingConn struct {
	net.Conn
	t       *netTransport
	once    sync.Once
	inbound bool
	left    int // bytes an inbound stream may still read
}

func (c *countingConn) Read(p []byte) (int, error) {
	if c.inbound {
		if c.left <= 0 {
			return 0, errStreamTooLong
		}
		p = p[:min(len(p), c.left)]
	}
	n, err := c.Conn.Read(p)
	c.left -= n
	c.t.streamBytesRecv.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.t.streamBytesSent.Add(uint64(n))
	return n, err
}

func (c *countingConn) Close() error {
	c.once.Do(func() {
		c.t.untrack(c)
		if c.inbound {
			c.t.inbound.Add(-1)
		}
	})
	return c.Conn.Close()
}
