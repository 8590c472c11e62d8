package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Errors returned by Membership.
var (
	// ErrUnknownNode is returned for a node name that is not in the config.
	ErrUnknownNode = errors.New("cluster: unknown node")
	// ErrNodeDown is returned when a message is sent to a node that is not up.
	ErrNodeDown = errors.New("cluster: node down")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("cluster: membership closed")
)

// NodeUp is published when a peer has connected, authenticated and sent its
// capabilities. A peer that restarted comes back with a new Incarnation.
type NodeUp struct {
	Node        string
	Incarnation uint64
}

// NodeDown is published when a peer's control connection is lost or the
// peer stayed silent longer than FailureTimeout.
type NodeDown struct {
	Node        string
	Incarnation uint64
	Reason      string
}

// Handler receives what Membership sees. Its methods are called from
// connection goroutines: PeerUp and PeerDown in order for one peer, HandleFrame
// in the peer's frame order. They must not block for long.
type Handler interface {
	PeerUp(p *Peer)
	PeerDown(p *Peer, cause error)
	// HandleFrame gets every frame that is not membership's own (handshake,
	// caps, ping, pong, goaway). The frame is valid only during the call.
	HandleFrame(p *Peer, f wire.Frame)
	// HandleDataConn takes ownership of an authenticated data connection
	// that a peer opened for the named channel. The connection counts
	// against Options.MaxDataConnsPerPeer and MaxDataConns until it is
	// closed.
	HandleDataConn(peer string, channel string, conn net.Conn)
}

// Peer is one live control connection to another node of the cluster.
type Peer struct {
	Name        string
	Incarnation uint64
	// Caps is the opaque capability body the peer sent after the handshake.
	Caps []byte

	conn      *wire.Conn
	transport string // what the connection's bytes go over: shm, tcp, tls...
	initiator string // which end dialed
	addr      string // the connection's remote address
	lastSeen  atomic.Int64
	up        chan struct{} // closed when caps arrived
	upOnce    sync.Once
	m         *Membership
}

// Send queues a frame to the peer; it blocks while the connection's queue is
// full (backpressure) until ctx is done.
func (p *Peer) Send(ctx context.Context, t wire.FrameType, flags wire.Flags, stream uint32, body any) error {
	return p.conn.Send(ctx, t, flags, stream, body)
}

// SendMessage queues a user message to the peer, batched with the messages
// sent while the connection's writer is busy (see wire.Conn.SendMessage);
// it blocks while the queue is full until ctx is done.
func (p *Peer) SendMessage(ctx context.Context, m *wire.Message) error {
	return p.conn.SendMessage(ctx, m)
}

// Transport names what the peer's control connection runs over: "shm"
// (shared memory rings, between processes of one host: see package shm),
// "tls", or the socket's network ("tcp").
func (p *Peer) Transport() string { return p.transport }

// HandlerMayBlock says, from within Handler.HandleFrame for a message,
// that the message has its place downstream (an actor's mailbox, the
// engine's inbox) and that the rest of the call may block, running actor
// code: a call that runs longer than the transport's handler_takeover then
// hands the connection's reading to a new goroutine (wire.Conn.MayBlock).
// A call that does not say so is waited for, so that the next message
// never overtakes it.
func (p *Peer) HandlerMayBlock() { p.conn.MayBlock() }

// Await lets the calling goroutine, which waits for a frame from the peer
// (a request's reply), read the peer's connection itself until ready
// reports true (wire.Conn.Await: a thread wake-up and a hand-off saved per
// round trip). It reports whether the caller must still wait its own way.
func (p *Peer) Await(ctx context.Context, w *wire.Waiter, ready func() bool) bool {
	return p.conn.Await(ctx, w, ready)
}

// Close starts closing the peer's connection with the given cause and
// returns at once; it is safe to call from Handler methods.
func (p *Peer) Close(cause error) { p.conn.Fail(cause) }

type slot struct {
	cfg       config.NodeConfig
	cur       *Peer
	dataConns int   // open data connections the peer dialed to this node
	lastErr   error // why the last dial failed; nil after a success
	dialing   bool  // a dial to this peer is in flight
	// accepting: a connection from this peer passed the tie-break and is
	// being attached; no dial starts meanwhile (it could otherwise replace
	// a connection on which this node already sent its capabilities, and
	// which the peer may already use).
	accepting bool
	// highest is the highest incarnation of the peer attached so far: a
	// restarted node always comes back higher (incarnations are
	// time-ordered), so a lower one is an impostor or a stale process and
	// never displaces the live node.
	highest uint64
	changed chan struct{} // closed and replaced whenever cur changes
}

// Membership keeps one authenticated control connection to every other node
// in the config, with heartbeats, reconnection with backoff, and NodeUp /
// NodeDown reports.
type Membership struct {
	cfg         *config.Config
	transport   config.TransportConfig // cfg.Transport with its defaults
	self        config.NodeConfig
	incarnation uint64
	caps        []byte
	h           Handler
	log         *zap.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	net    Network

	maxDataPerPeer int
	maxData        int
	dataIdle       time.Duration
	readSpin       time.Duration
	shm            shm.Config
	shmOffer       bool // shm.Usable: offered and accepted in handshakes

	mu        sync.Mutex
	slots     map[string]*slot
	dataConns int // open data connections peers dialed to this node
	lns       []net.Listener
	closed    bool

	dataByTransport connCounts // open data connections peers dialed to this node (stats.go)
}

// Options tune a Membership.
type Options struct {
	Logger *zap.Logger
	// Caps is the capability body sent to every peer after the handshake.
	Caps []byte
	// Network is where the node listens and dials; nil means TCP. Tests
	// pass an in-memory network to inject faults.
	Network Network
	// SharedMemory configures the shared-memory transport (package shm) of
	// control connections between processes of one host, on by default
	// (and off when the config's transport.shared_memory is false): both
	// ends that offer it and find they share a host move the connection's
	// bytes to shared memory rings after the handshake; other connections
	// stay on their sockets.
	SharedMemory shm.Config
}

// Network listens and dials by address: TCP by default, or an in-memory
// network in tests. Its methods are called from several goroutines.
type Network interface {
	// Listen listens on address (host:port for TCP).
	Listen(address string) (net.Listener, error)
	// DialContext connects to address; ctx bounds the dial only.
	DialContext(ctx context.Context, address string) (net.Conn, error)
}

// tcpNetwork is the default Network.
type tcpNetwork struct{}

func (tcpNetwork) Listen(address string) (net.Listener, error) { return net.Listen("tcp", address) }

func (tcpNetwork) DialContext(ctx context.Context, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", address)
}

// NewMembership prepares membership for the node named self with the given
// incarnation (unique per process start). Start begins listening and dialing.
func NewMembership(cfg *config.Config, self string, incarnation uint64, h Handler, opts Options) (*Membership, error) {
	nc, ok := cfg.Node(self)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not in the config of cluster %q", ErrUnknownNode, self, cfg.Cluster)
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	// A config that was not validated still gets the transport defaults.
	tr := cfg.Transport.WithDefaults()
	m := &Membership{cfg: cfg, transport: tr, self: nc, incarnation: incarnation, caps: opts.Caps, h: h,
		log: log.With(zap.String("node", self)), slots: map[string]*slot{},
		maxDataPerPeer: tr.MaxDataConnsPerPeer,
		maxData:        tr.MaxDataConns,
		dataIdle:       cmp.Or(tr.DataIdleTimeout, cfg.DialTimeout),
		net:            opts.Network,
		shm:            opts.SharedMemory}
	if !tr.SharedMemory {
		m.shm.Disable = true
	}
	switch {
	case tr.ReadSpin == 0:
		m.readSpin = wire.DefaultReadSpinFor()
	case tr.ReadSpin > 0:
		m.readSpin = tr.ReadSpin
	}
	if m.net == nil {
		m.net = tcpNetwork{}
	}
	if m.maxDataPerPeer < 0 || m.maxData < 0 || m.dataIdle < 0 {
		return nil, fmt.Errorf("cluster: negative transport settings: max_data_conns_per_peer %d, max_data_conns %d, data_idle_timeout %v (call Validate)",
			m.maxDataPerPeer, m.maxData, m.dataIdle)
	}
	if err := m.shm.Usable(); err != nil {
		m.log.Debug("shared memory transport not offered", zap.Error(err))
	} else {
		m.shmOffer = true
	}
	for _, n := range cfg.Nodes {
		if n.Name != self {
			m.slots[n.Name] = &slot{cfg: n, changed: make(chan struct{})}
		}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// Start opens the control and data listeners and starts dialing every peer.
func (m *Membership) Start() error {
	cl, err := m.net.Listen(m.self.Address)
	if err != nil {
		return fmt.Errorf("cluster: control listener: %w", err)
	}
	dl, err := m.net.Listen(m.self.DataAddress)
	if err != nil {
		cl.Close()
		return fmt.Errorf("cluster: data listener: %w", err)
	}
	m.mu.Lock()
	m.lns = []net.Listener{cl, dl}
	m.mu.Unlock()
	m.wg.Add(2)
	go m.acceptLoop(cl, false)
	go m.acceptLoop(dl, true)
	for name := range m.slots {
		m.wg.Add(1)
		go m.dialLoop(name)
	}
	m.wg.Add(1)
	go m.heartbeatLoop()
	return nil
}

// Self returns this node's config.
func (m *Membership) Self() config.NodeConfig { return m.self }

// Incarnation returns this node's incarnation.
func (m *Membership) Incarnation() uint64 { return m.incarnation }

// Peer returns the live peer named name, if it is up.
func (m *Membership) Peer(name string) (*Peer, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.slots[name]
	if !ok || s.cur == nil {
		return nil, false
	}
	select {
	case <-s.cur.up:
		return s.cur, true
	default:
		return nil, false
	}
}

// LastError returns why the last attempt to dial the named peer failed, or
// nil if it succeeded or none was made yet.
func (m *Membership) LastError(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.slots[name]; ok {
		return s.lastErr
	}
	return fmt.Errorf("%w: %q", ErrUnknownNode, name)
}

// Known reports whether name is a node of the config other than self.
func (m *Membership) Known(name string) bool {
	_, ok := m.slots[name]
	return ok
}

// Peers returns the peers that are up.
func (m *Membership) Peers() []*Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Peer
	for _, s := range m.slots {
		if s.cur != nil {
			select {
			case <-s.cur.up:
				out = append(out, s.cur)
			default:
			}
		}
	}
	return out
}

// WaitUp blocks until the named peer is up or ctx is done.
func (m *Membership) WaitUp(ctx context.Context, name string) (*Peer, error) {
	for {
		m.mu.Lock()
		s, ok := m.slots[name]
		if !ok {
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %q", ErrUnknownNode, name)
		}
		cur, changed := s.cur, s.changed
		m.mu.Unlock()
		if cur != nil {
			select {
			case <-cur.up:
				return cur, nil
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("cluster: waiting for %s: %w", name, ctx.Err())
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: waiting for %s: %w", name, ctx.Err())
		case <-m.ctx.Done():
			return nil, ErrClosed
		}
	}
}

func (m *Membership) handshakeConfig(purpose, expect string) wire.HandshakeConfig {
	return wire.HandshakeConfig{
		Cluster:     m.cfg.Cluster,
		Node:        m.self.Name,
		Incarnation: m.incarnation,
		Secret:      m.cfg.Secret,
		Purpose:     purpose,
		Timeout:     m.cfg.DialTimeout,
		Expect:      expect,
		// Only control connections: data connections carry bulk bytes,
		// which the data channels move.
		SharedMemory: purpose == wire.PurposeControl && m.shmOffer,
	}
}

// upgrade runs shm.Upgrade on a control connection whose handshake agreed
// to it. It returns the connection to go on with (the rings, or nc when
// staying on the socket), or an error, with nc closed.
func (m *Membership) upgrade(ctx context.Context, nc net.Conn, peer wire.Peer, initiator bool) (net.Conn, error) {
	if !peer.SharedMemory {
		return nc, nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	c, err := shm.Upgrade(ctx, nc, m.shm, initiator)
	switch {
	case err == nil:
		m.log.Debug("control connection on shared memory", zap.String("peer", peer.Node))
		return c, nil
	case errors.Is(err, shm.ErrFallback):
		m.log.Debug("control connection stays on its socket", zap.String("peer", peer.Node), zap.Error(err))
		return nc, nil
	default:
		return nil, err
	}
}

// Accept retry delays: after a failed Accept (EMFILE, ENFILE, ENOBUFS...)
// the loop waits acceptRetryMin, doubling up to acceptRetryMax, as
// net/http's Server.Serve does.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// acceptLoop accepts connections until ln is closed. Any other Accept error
// (out of file descriptors, most often) is retried with backoff, so a node
// that ran out of descriptors accepts again once some are freed; the first
// failure of a burst is logged, and the recovery.
func (m *Membership) acceptLoop(ln net.Listener, data bool) {
	defer m.wg.Done()
	var delay time.Duration // 0 outside a burst of failures
	failures := 0
	for {
		nc, err := ln.Accept()
		if err != nil {
			if m.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			failures++
			if delay == 0 {
				delay = acceptRetryMin
				m.log.Warn("accept failed; retrying with backoff", zap.Stringer("listener", ln.Addr()), zap.Error(err))
			} else {
				delay = min(2*delay, acceptRetryMax)
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-m.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		if delay != 0 {
			m.log.Info("accepting again", zap.Stringer("listener", ln.Addr()), zap.Int("failed_accepts", failures))
			delay, failures = 0, 0
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.accept(nc, data)
		}()
	}
}

func (m *Membership) accept(nc net.Conn, data bool) {
	purpose := wire.PurposeControl
	if data {
		purpose = wire.PurposeData
	}
	nc, err := secure(m.ctx, m.cfg, nc, data, false)
	if err != nil {
		m.log.Warn("tls handshake refused", zap.Error(err))
		return
	}
	remote := nc.RemoteAddr().String()
	hc := m.handshakeConfig(purpose, "")
	var admitErr error
	reserved := ""
	var tieBreak, duplicate bool
	var accepting *slot // set when this connection passed the tie-break
	hc.Admit = func(p wire.Peer) error {
		if !m.Known(p.Node) {
			admitErr = &wire.ConnError{Code: wire.CodeNotFound,
				Reason: fmt.Sprintf("node %q is not in the config of cluster %q at node %q", p.Node, m.cfg.Cluster, m.self.Name)}
			return admitErr
		}
		if data {
			if admitErr = m.reserveData(p); admitErr != nil {
				return admitErr
			}
			reserved = p.Node
			return nil
		}
		// Both ends dial; when both dials are in flight, the connection
		// dialed by the node with the smaller name wins, so the larger
		// one's is refused here, in the handshake: its dialer retries
		// after its backoff, and nothing was up to be torn down.
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.closed {
			admitErr = &wire.ConnError{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"}
			return admitErr
		}
		s := m.slots[p.Node]
		if s.dialing && m.self.Name < p.Node {
			tieBreak = true
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("both ends dialed; the connection dialed by %s wins", m.self.Name)}
			return admitErr
		}
		// A connection that attach would close as a duplicate is refused
		// now, before the shared-memory upgrade.
		if s.cur != nil && s.cur.Incarnation == p.Incarnation && m.keeps(s.cur, p.Node) {
			duplicate = true
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("%s already has a connection from this incarnation of %s", m.self.Name, p.Node)}
			return admitErr
		}
		s.accepting = true // until attach decided
		accepting = s
		return nil
	}
	peer, err := wire.Handshake(m.ctx, nc, hc, false)
	if err != nil {
		if reserved != "" {
			m.releaseData(reserved)
		}
		if accepting != nil {
			m.mu.Lock()
			accepting.accepting = false
			m.mu.Unlock()
			m.wakeDialer(accepting)
		}
		switch {
		case tieBreak:
			m.log.Info("inbound connection refused: own dial to it in flight", zap.String("remote", remote))
		case duplicate:
			m.log.Info("duplicate connection refused", zap.String("remote", remote))
		case admitErr != nil:
			m.log.Warn("connection refused", zap.String("purpose", purpose), zap.String("remote", remote), zap.String("reason", admitErr.Error()))
		case m.ctx.Err() != nil: // the node is stopping
			m.log.Debug("handshake ended by the node's stop", zap.String("remote", remote), zap.Error(err))
		default:
			m.log.Warn("handshake refused", zap.String("remote", remote), zap.Error(err))
		}
		return
	}
	if data {
		tr := transportOf(nc)
		m.dataByTransport.add(tr, 1)
		dc := &dataConn{Conn: nc}
		dc.release = func() { m.releaseData(peer.Node); m.dataByTransport.add(tr, -1) }
		m.serveData(peer, dc)
		return
	}
	// After the tie-break (in Admit): a refused dialer saw a failed dial.
	if nc, err = m.upgrade(m.ctx, nc, peer, false); err != nil {
		if m.ctx.Err() != nil { // the node is stopping
			m.log.Debug("shared memory upgrade ended by the node's stop", zap.String("peer", peer.Node), zap.Error(err))
		} else {
			m.log.Warn("shared memory upgrade failed", zap.String("peer", peer.Node), zap.String("remote", remote), zap.Error(err))
		}
		m.mu.Lock()
		accepting.accepting = false
		m.mu.Unlock()
		m.wakeDialer(accepting)
		return
	}
	m.attach(nc, peer, peer.Node)
}

// reserveData counts a data connection from p against the bounds, or says
// why it is refused: p is not a member now (no control connection from this
// incarnation of it) or holds too many.
func (m *Membership) reserveData(p wire.Peer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slots[p.Node]
	switch {
	case m.closed:
		return &wire.ConnError{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"}
	case s.cur == nil || s.cur.Incarnation != p.Incarnation:
		return &wire.ConnError{Code: wire.CodeUnavailable,
			Reason: fmt.Sprintf("data connection refused: %s (incarnation %d) has no control connection to %s", p.Node, p.Incarnation, m.self.Name)}
	case s.dataConns >= m.maxDataPerPeer:
		return &wire.ConnError{Code: wire.CodeUnavailable,
			Reason: fmt.Sprintf("data connection refused: %s holds %d data connections to %s, the most per peer", p.Node, s.dataConns, m.self.Name)}
	case m.dataConns >= m.maxData:
		return &wire.ConnError{Code: wire.CodeUnavailable,
			Reason: fmt.Sprintf("data connection refused: %s holds %d data connections, the most per node", m.self.Name, m.dataConns)}
	}
	s.dataConns++
	m.dataConns++
	return nil
}

func (m *Membership) releaseData(node string) {
	m.mu.Lock()
	m.slots[node].dataConns--
	m.dataConns--
	m.mu.Unlock()
}

// dataConn is an accepted data connection; closing it frees its place
// under the bounds on data connections.
type dataConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *dataConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// serveData reads the channel name the dialer sends first (one length byte
// and the name) within the data idle timeout, and hands the connection to
// the handler.
func (m *Membership) serveData(peer wire.Peer, nc net.Conn) {
	stop := context.AfterFunc(m.ctx, func() { nc.Close() })
	defer stop()
	_ = nc.SetReadDeadline(time.Now().Add(m.dataIdle))
	var n [1]byte
	if _, err := nc.Read(n[:]); err != nil || n[0] == 0 || n[0] > config.MaxChannelNameLen {
		m.log.Warn("data connection: bad channel name", zap.String("peer", peer.Node), zap.Error(err))
		nc.Close()
		return
	}
	name := make([]byte, n[0])
	if _, err := readFull(nc, name); err != nil {
		m.log.Warn("data connection: bad channel name", zap.String("peer", peer.Node), zap.Error(err))
		nc.Close()
		return
	}
	if err := config.CheckChannelName(string(name)); err != nil {
		m.log.Warn("data connection: bad channel name", zap.String("peer", peer.Node), zap.Error(err))
		nc.Close()
		return
	}
	if !stop() {
		return // closed by Close
	}
	_ = nc.SetReadDeadline(time.Time{})
	m.h.HandleDataConn(peer.Node, string(name), nc)
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// DialData opens an authenticated data connection to node's data listener
// for the named channel (a name as in Config.DisableChannels).
func (m *Membership) DialData(ctx context.Context, node, channel string) (net.Conn, error) {
	s, ok := m.slots[node]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, node)
	}
	if err := config.CheckChannelName(channel); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	nc, err := m.net.DialContext(dctx, s.cfg.DataAddress)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("cluster: dial data %s: %w", node, err)
	}
	if nc, err = secure(ctx, m.cfg, nc, true, true); err != nil {
		return nil, err
	}
	if _, err := wire.Handshake(ctx, nc, m.handshakeConfig(wire.PurposeData, node), true); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := nc.Write(append([]byte{byte(len(channel))}, channel...)); err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: data %s: %w", node, err)
	}
	return nc, nil
}

func (m *Membership) dialLoop(name string) {
	defer m.wg.Done()
	backoff := m.cfg.ReconnectMin
	for {
		m.mu.Lock()
		s := m.slots[name]
		cur, changed := s.cur, s.changed
		s.dialing = cur == nil && !s.accepting
		m.mu.Unlock()
		if cur != nil || !s.dialing {
			select {
			case <-changed:
				backoff = m.cfg.ReconnectMin
				continue
			case <-m.ctx.Done():
				return
			}
		}
		err := m.dial(s.cfg)
		m.mu.Lock()
		s.dialing = false
		s.lastErr = err
		m.mu.Unlock()
		if err != nil {
			m.log.Debug("dial failed", zap.String("peer", name), zap.Error(err))
			wait := backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, m.cfg.ReconnectMax)
			select {
			case <-time.After(wait):
			case <-changed:
			case <-m.ctx.Done():
				return
			}
		}
	}
}

func (m *Membership) dial(nc config.NodeConfig) error {
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.DialTimeout)
	defer cancel()
	c, err := m.net.DialContext(ctx, nc.Address)
	if err != nil {
		return err
	}
	if c, err = secure(ctx, m.cfg, c, false, true); err != nil {
		return err
	}
	peer, err := wire.Handshake(ctx, c, m.handshakeConfig(wire.PurposeControl, nc.Name), true)
	if err != nil {
		c.Close()
		return err
	}
	if c, err = m.upgrade(ctx, c, peer, true); err != nil {
		return err
	}
	m.attach(c, peer, m.self.Name)
	return nil
}

// attach makes nc the peer's control connection. A connection to the same
// incarnation never replaces one that is up (no flapping); one that is not
// up yet gives way to the connection dialed by the node with the smaller
// name.
func (m *Membership) attach(nc net.Conn, wp wire.Peer, initiator string) {
	p := &Peer{Name: wp.Node, Incarnation: wp.Incarnation, initiator: initiator, up: make(chan struct{}), m: m, addr: remoteAddr(nc), transport: transportOf(nc)}
	p.lastSeen.Store(time.Now().UnixNano())
	p.conn = wire.NewConn(nc, wp, wire.ConnOptions{
		MaxFrameSize: uint32(m.transport.MaxFrameSize),
		SendQueue:    m.transport.SendQueue,
		DirectWrite:  true,
		// Messages wake actors and callers: let them run here, now.
		YieldAfterHandler: true,
		// Handlers may run actor code inline (actor.WithInlineDelivery):
		// one that blocks hands the reading to a new goroutine.
		HandlerTakeover: m.transport.HandlerTakeover,
		ReadSpin:        m.readSpin,
		Logger:          m.log,
		Handler:         func(f wire.Frame) { m.frame(p, f) },
		OnClose:         func(err error) { m.connClosed(p, err) },
	})
	m.mu.Lock()
	s := m.slots[wp.Node]
	if initiator != m.self.Name {
		s.accepting = false
		defer m.wakeDialer(s)
	}
	if m.closed {
		m.mu.Unlock()
		// The peer's handshake succeeded: say goodbye, as Close does to
		// the peers it knew, so that it does not see a failure.
		_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_ = wire.NewFramer(nc, nil).WriteBody(wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"})
		_ = p.conn.Close(ErrClosed)
		return
	}
	if wp.Incarnation < s.highest {
		live, liveAddr := s.highest, "(not connected now)"
		if s.cur != nil {
			liveAddr = s.cur.addr
		}
		m.mu.Unlock()
		m.log.Error("connection from an older incarnation refused: the higher incarnation wins",
			zap.String("peer", wp.Node), zap.Uint64("incarnation", wp.Incarnation), zap.String("address", remoteAddr(nc)),
			zap.Uint64("live_incarnation", live), zap.String("live_address", liveAddr))
		_ = nc.Close()
		return
	}
	old := s.cur
	if old != nil && old.Incarnation == wp.Incarnation {
		if m.keeps(old, initiator) {
			m.mu.Unlock()
			m.log.Info("duplicate connection closed", zap.String("peer", wp.Node))
			_ = nc.Close()
			return
		}
	}
	s.cur = p
	s.highest = max(s.highest, wp.Incarnation)
	close(s.changed)
	s.changed = make(chan struct{})
	m.mu.Unlock()
	if old != nil {
		reason := errors.New("replaced by a new connection")
		if old.Incarnation != wp.Incarnation {
			reason = fmt.Errorf("restarted as incarnation %d", wp.Incarnation)
		}
		m.down(old, reason)
		_ = old.conn.Close(reason)
	}
	// Caps are queued before the connection starts: once the peer's caps
	// arrive (the reader runs from Start on) this node may send messages,
	// and they must not overtake its own caps.
	if err := p.conn.Send(m.ctx, wire.FrameCaps, 0, 0, &wire.Caps{Body: m.caps}); err != nil {
		p.conn.Fail(err)
	}
	p.conn.Start()
}

// transportOf names what nc runs over (Peer.Transport).
func transportOf(nc net.Conn) string {
	switch nc.(type) {
	case *shm.Conn:
		return shm.TransportShm
	case *tls.Conn:
		return "tls"
	}
	if a := nc.RemoteAddr(); a != nil {
		return a.Network()
	}
	return "?"
}

// remoteAddr names the other end of nc.
func remoteAddr(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil {
		return a.String()
	}
	return "?"
}

// wakeDialer wakes the dial loop of s, which may wait for an accepted
// connection to be attached (accepting).
func (m *Membership) wakeDialer(s *slot) {
	m.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *Membership) frame(p *Peer, f wire.Frame) {
	p.lastSeen.Store(time.Now().UnixNano())
	switch f := f.(type) {
	case *wire.CapsFrame:
		p.Caps = append([]byte(nil), f.Caps.Body...)
		first := false
		p.upOnce.Do(func() { first = true })
		if first {
			// The handler learns first, so that a WaitUp that returns finds
			// the peer ready everywhere.
			m.log.Info("node up", zap.String("peer", p.Name), zap.Uint64("incarnation", p.Incarnation))
			m.h.PeerUp(p)
			m.mu.Lock()
			s := m.slots[p.Name]
			current := s.cur == p
			if current {
				close(p.up)
				close(s.changed)
				s.changed = make(chan struct{})
			}
			m.mu.Unlock()
			if !current {
				m.h.PeerDown(p, errors.New("connection replaced or closed while coming up"))
			}
		}
	case *wire.PingFrame:
		_ = p.conn.Send(m.ctx, wire.FramePong, 0, 0, &wire.Pong{Seq: f.Ping.Seq, UnixNano: f.Ping.UnixNano})
	case *wire.PongFrame:
	case *wire.GoAwayFrame:
		m.log.Info("peer goes away", zap.String("peer", p.Name), zap.String("reason", f.GoAway.Reason))
		p.conn.End(fmt.Errorf("%w: peer goes away: %s", ErrNodeDown, f.GoAway.Reason))
	default:
		select {
		case <-p.up:
			m.h.HandleFrame(p, f)
		default:
			p.conn.Fail(fmt.Errorf("cluster: %v frame before capabilities", f.Header().Type))
		}
	}
}

func (m *Membership) connClosed(p *Peer, err error) {
	m.mu.Lock()
	s := m.slots[p.Name]
	current := s.cur == p
	if current {
		s.cur = nil
		close(s.changed)
		s.changed = make(chan struct{})
	}
	m.mu.Unlock()
	if current {
		m.down(p, err)
	}
}

// keeps reports whether old, the current connection to its peer, stays
// when another one of the same incarnation, dialed by initiator, comes:
// one that is up never gives way (no flapping), one that is not yet up
// gives way to the connection dialed by the node with the smaller name,
// and one that is closing always does. m.mu is held.
func (m *Membership) keeps(old *Peer, initiator string) bool {
	select {
	case <-old.conn.Done():
		return false
	default:
	}
	preferred := min(m.self.Name, old.Name)
	return isUp(old) || (old.initiator == preferred && initiator != preferred)
}

func isUp(p *Peer) bool {
	select {
	case <-p.up:
		return true
	default:
		return false
	}
}

// down reports p down if it had come up.
func (m *Membership) down(p *Peer, cause error) {
	select {
	case <-p.up:
	default:
		return
	}
	m.log.Info("node down", zap.String("peer", p.Name), zap.Uint64("incarnation", p.Incarnation), zap.Error(cause))
	m.h.PeerDown(p, cause)
}

func (m *Membership) heartbeatLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.HeartbeatInterval)
	defer t.Stop()
	var seq uint64
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			seq++
			m.mu.Lock()
			var peers []*Peer
			for _, s := range m.slots {
				if s.cur != nil {
					peers = append(peers, s.cur)
				}
			}
			m.mu.Unlock()
			for _, p := range peers {
				if silent := now.Sub(time.Unix(0, p.lastSeen.Load())); silent > m.cfg.FailureTimeout {
					p.conn.Fail(fmt.Errorf("%w: silent for %v (failure timeout %v)", ErrNodeDown, silent.Round(time.Millisecond), m.cfg.FailureTimeout))
					continue
				}
				ctx, cancel := context.WithTimeout(m.ctx, m.cfg.HeartbeatInterval)
				_ = p.conn.Send(ctx, wire.FramePing, 0, 0, &wire.Ping{Seq: seq, UnixNano: now.UnixNano()})
				cancel()
			}
		}
	}
}

// Close says goodbye to every peer, closes listeners and connections, and
// waits for every goroutine.
func (m *Membership) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	lns := m.lns
	var peers []*Peer
	for _, s := range m.slots {
		if s.cur != nil {
			peers = append(peers, s.cur)
		}
	}
	m.mu.Unlock()
	for _, p := range peers {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if p.conn.Send(ctx, wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"}) == nil {
			_ = p.conn.Flush(ctx)
		}
		cancel()
	}
	m.cancel()
	for _, l := range lns {
		l.Close()
	}
	for _, p := range peers {
		_ = p.conn.Close(ErrClosed)
	}
	m.wg.Wait()
	return nil
}

// String describes the membership for logs.
func (m *Membership) String() string {
	var up []string
	for _, p := range m.Peers() {
		up = append(up, p.Name)
	}
	return fmt.Sprintf("%s@%s up=[%s]", m.self.Name, m.self.Address, strings.Join(up, ","))
}
