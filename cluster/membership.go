package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tensorferry/tensorferry/cluster/gossip"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/discovery"
	"github.com/tensorferry/tensorferry/internal/mono"
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
// capabilities: with the mesh as soon as the connection to it is up, with
// gossip membership when this node first reaches it (a node never written
// to is a member — Membership.Members — but not up here), and for a
// mesh_only peer as with the mesh. A peer that restarted comes back with a
// new Incarnation.
type NodeUp struct {
	Node        string
	Incarnation uint64
}

// NodeDown is published when a peer that was up is gone: with the mesh,
// its control connection is lost, it stayed silent longer than
// FailureTimeout, or discovery reported it gone; with gossip membership, gossip declared it dead, it left
// or restarted, discovery reported it gone, or a control connection to it
// broke (not one closed for idleness); a mesh_only peer as with the mesh.
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

// Peer is another node of the cluster as this node sees it: one
// incarnation of it, from the moment its capabilities arrived (PeerUp) to
// PeerDown. With the full mesh (membership: mesh) a Peer lives as long as
// its one control connection; with gossip membership the control
// connection is dialed on first use and closed after the transport's
// idle_timeout, and the Peer outlives it: a send after an idle close dials
// again (see Send). A node of the config marked mesh_only (a Python node)
// is kept by the mesh's rules in a gossip cluster too, and a mesh_only
// node keeps every peer so (Mesh).
type Peer struct {
	Name        string
	Incarnation uint64
	// Caps is the opaque capability body the peer sent after the handshake.
	Caps []byte

	link      atomic.Pointer[link] // the current control connection; nil while idle (gossip)
	initiator string               // which end dialed the first connection
	mesh      bool                 // kept by the mesh's rules (slot.mesh)
	// lastSeen is when the last frame from it came, at most one check of
	// the heartbeat loop early: frames only count themselves (frames), and
	// the loop, finding the count moved, stamps the time of its previous
	// check, which they came after. No clock is read per frame.
	lastSeen atomic.Int64  // on mono's clock
	frames   atomic.Uint64 // frames read from it
	framesAt uint64        // frames at the heartbeat loop's last check (the loop's own)
	checked  bool          // the heartbeat loop has checked it once (the loop's own)
	up       chan struct{} // closed when caps arrived
	isUp     atomic.Bool   // set as up is closed: read once per frame
	upOnce   sync.Once
	downOnce sync.Once
	gone     atomic.Bool // no longer its slot's current Peer
	// gate counts the senders using the current link (low bits), marks a
	// drain that closes an idle link (gateDrain) and counts sends (high
	// bits), with gossip membership only (ondemand.go).
	gate atomic.Uint64
	// lastTransport is the transport of the latest link.
	lastTransport atomic.Pointer[string]
	m             *Membership
	local         atomic.Value // SetLocal
}

// SetLocal attaches v to p: the Handler's own state of this peer, which
// it then finds from p without a lookup. v must not be nil, and every
// value attached to a Peer must be of one type.
func (p *Peer) SetLocal(v any) { p.local.Store(v) }

// Local returns what SetLocal attached to p, or nil.
func (p *Peer) Local() any { return p.local.Load() }

// link is one control connection of a Peer.
type link struct {
	conn      *wire.Conn
	transport string // what its bytes go over: shm, tcp, tls...
	addr      string // its remote address
	// The idle close (ondemand.go): said once this end sent its GoAway
	// (CodeIdle), heard once the peer's arrived.
	said      atomic.Bool
	heard     chan struct{}
	heardOnce sync.Once
}

// setLink makes l the Peer's current link.
func (p *Peer) setLink(l *link) {
	p.lastSeen.Store(mono.Now())
	p.lastTransport.Store(&l.transport)
	p.link.Store(l)
}

// conn returns the current connection (with the full mesh, the one
// connection of the Peer).
func (p *Peer) conn() *wire.Conn {
	if l := p.link.Load(); l != nil {
		return l.conn
	}
	return nil
}

// Mesh reports whether p is kept by the mesh's rules: one control
// connection for its life, heartbeats, never closed for idleness. It is
// so with the full mesh, and with gossip membership for a peer whose
// config entry is mesh_only, or on a node whose own entry is.
func (p *Peer) Mesh() bool { return p.mesh }

// Send queues a frame to the peer; it blocks while the connection's queue is
// full (backpressure) until ctx is done. With gossip membership a peer
// whose control connection was closed for idleness is dialed again first.
func (p *Peer) Send(ctx context.Context, t wire.FrameType, flags wire.Flags, stream uint32, body any) error {
	if p.mesh {
		return p.link.Load().conn.Send(ctx, t, flags, stream, body)
	}
	c, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release()
	return c.Send(ctx, t, flags, stream, body)
}

// SendMessage queues a user message to the peer, batched with the messages
// sent while the connection's writer is busy (see wire.Conn.SendMessage);
// it blocks while the queue is full until ctx is done. It dials as Send
// does.
func (p *Peer) SendMessage(ctx context.Context, m *wire.Message) error {
	if p.mesh {
		return p.link.Load().conn.SendMessage(ctx, m)
	}
	c, err := p.acquire(ctx)
	if err != nil {
		return err
	}
	defer p.release()
	return c.SendMessage(ctx, m)
}

// Transport names what the peer's control connection runs over, or ran
// over last: "shm" (shared memory rings, between processes of one host:
// see package shm), "tls", or the socket's network ("tcp").
func (p *Peer) Transport() string {
	if t := p.lastTransport.Load(); t != nil {
		return *t
	}
	return ""
}

// HandlerMayBlock says, from within Handler.HandleFrame for a message,
// that the message has its place downstream (an actor's mailbox, the
// engine's inbox) and that the rest of the call may block, running actor
// code: a call that runs longer than the transport's handler_takeover then
// hands the connection's reading to a new goroutine (wire.Conn.MayBlock).
// A call that does not say so is waited for, so that the next message
// never overtakes it.
func (p *Peer) HandlerMayBlock() {
	if c := p.conn(); c != nil {
		c.MayBlock()
	}
}

// ExpectReply says that the calling goroutine is about to wait, by its
// own means (a protoactor future), for a frame from the peer: a Handler call
// that declared HandlerMayBlock, which may be the waiter itself, then hands
// the connection's reading to a new goroutine at once instead of after
// handler_takeover (wire.Conn.ExpectReply).
func (p *Peer) ExpectReply() {
	if c := p.conn(); c != nil {
		c.ExpectReply()
	}
}

// Await lets the calling goroutine, which waits for a frame from the peer
// (a request's reply), read the peer's connection itself until ready
// reports true (wire.Conn.Await: a thread wake-up and a hand-off saved per
// round trip). It reports whether the caller must still wait its own way.
func (p *Peer) Await(ctx context.Context, w *wire.Waiter, ready func() bool) bool {
	if c := p.conn(); c != nil {
		return c.Await(ctx, w, ready)
	}
	return true
}

// Close starts closing the peer's connection with the given cause and
// returns at once; the peer goes down. It is safe to call from Handler
// methods.
func (p *Peer) Close(cause error) {
	if c := p.conn(); c != nil {
		c.Fail(cause)
		return
	}
	p.m.dropPeer(p, cause)
}

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
	// alive: the node is a member now (always, for the config's nodes with
	// the full mesh; while gossip says so with gossip membership, which
	// also gives inc, the incarnation it knows).
	alive bool
	inc   uint64
	// gossipAlive: gossip says the node is alive; evicted: the discovery
	// source said it is gone (discover.go). alive is gossipAlive and not
	// evicted with gossip membership, not evicted with the full mesh.
	gossipAlive bool
	evicted     bool
	// dialer: a dialLoop runs for the node (the full mesh).
	dialer bool
	// mesh: the node is kept by the mesh's rules (a dialLoop, heartbeats,
	// alive unless evicted): every node with the full mesh; with gossip
	// membership a node of the config marked mesh_only, which gossip does
	// not speak for. Set when the slot is made, never changed.
	mesh bool
	// idle bookkeeping of the current Peer (ondemand.go): the send and
	// received-frame counts last seen and when each last changed.
	sends       uint64
	sendsMoved  int64 // mono.Now
	frames      uint64
	framesMoved int64 // mono.Now
	failures    int   // dials failed in a row (connect's backoff)
}

// Membership tracks the other nodes of the cluster and the control
// connections to them: with the mesh, one to every node of the config,
// with heartbeats and reconnection with backoff; with gossip membership,
// the members gossip reports, connected on demand, and the config's
// mesh_only nodes as with the mesh (a mesh_only node itself runs the
// mesh to every node). It reports NodeUp and
// NodeDown (to its Handler, as PeerUp and PeerDown).
type Membership struct {
	cfg         *config.Config
	transport   config.TransportConfig // cfg.Transport with its defaults
	self        config.NodeConfig
	incarnation uint64
	caps        []byte
	h           Handler
	log         *zap.Logger
	// unknownWarn limits the warnings about gossip members that are not
	// in the config; incarnationWarn those about connections refused for
	// their incarnation.
	unknownWarn     logLimit
	incarnationWarn logLimit
	announceWarn    logLimit // announced nodes beyond MaxMeshAnnounced
	// baseLog is the logger the node gave, without this node's name:
	// for components that name the node themselves (gossip).
	baseLog *zap.Logger

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
	// shmLimits: one upgrade in flight per peer, regions within the budget.
	shmLimits *shm.Limits
	// onDemand: gossip membership (gossip.go) with control connections
	// dialed on first use (ondemand.go), but to the slots marked mesh;
	// false: the full mesh (also a mesh_only node of a gossip cluster).
	onDemand bool
	gossip   *gossip.Gossip
	joined   chan struct{} // closed and replaced when a member joins (gossip) or is announced (mesh)
	disc     discovery.Discovery
	seeds    map[string]config.NodeConfig // nodes the discovery source announces
	seedWake chan struct{}
	opts     Options

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
	// GossipTransport, when set, wraps the transport of the node's gossip
	// (gossip membership only): tests and benchmarks count its packets or
	// freeze a node with it. Nil: memberlist's UDP and TCP transport.
	GossipTransport func(memberlist.Transport) memberlist.Transport
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
		log: log.With(zap.String("node", self)), baseLog: log, slots: map[string]*slot{},
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
	if m.shm.Spin == 0 {
		// transport.read_spin is the control connections' spin, on the
		// rings as on sockets (its default is theirs too).
		m.shm.Spin = tr.ReadSpin
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
	m.shmLimits = shm.NewLimits(m.shm)
	m.opts = opts
	m.joined = make(chan struct{})
	// A mesh_only node of a gossip cluster starts no gossip and keeps
	// every peer by the mesh's rules, as a Python node does.
	m.onDemand = cfg.MembershipMode() == config.MembershipGossip && !nc.MeshOnly
	// The full mesh: every node of the config, dialed from Start on (and,
	// with discovery, every node announced: discover.go). Gossip: the
	// config's mesh_only nodes only; gossip makes the others known.
	for _, n := range cfg.Nodes {
		if n.Name != self && (!m.onDemand || n.MeshOnly) {
			m.slots[n.Name] = &slot{cfg: n, changed: make(chan struct{}), alive: true, mesh: true}
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
	// Listeners are up: a Close from now on stops them.
	m.wg.Add(2)
	go m.acceptLoop(cl, false)
	go m.acceptLoop(dl, true)
	if m.onDemand {
		err := m.startGossip()
		if err == nil {
			err = m.startDiscovery()
		}
		if err != nil {
			m.cancel()
			cl.Close()
			dl.Close()
			m.stopDiscovery()
			m.wg.Wait()
			m.stopGossip()
			return err
		}
		m.wg.Add(1)
		go m.idleLoop()
	}
	mesh := false
	m.mu.Lock()
	for _, s := range m.slots {
		if s.mesh {
			m.startDialer(s)
			mesh = true
		}
	}
	// With gossip, discovery may announce mesh_only nodes later.
	mesh = mesh || m.disc != nil
	m.mu.Unlock()
	if mesh || !m.onDemand {
		m.wg.Add(1)
		go m.heartbeatLoop()
	}
	if m.onDemand {
		return nil
	}
	if err := m.startDiscovery(); err != nil {
		// Peers may be up already (the config's, or inbound): closed
		// as by Close.
		_ = m.Close()
		return err
	}
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

// Known reports whether name is another node of the cluster now: with
// the full mesh in the config or announced by discovery (and not reported
// gone by it since), with gossip membership alive in gossip.
func (m *Membership) Known(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.slots[name]
	return ok && s.alive
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

// WaitUp blocks until the named peer is up or ctx is done. With gossip
// membership it waits for the node to join and dials it (see Connect);
// with the full mesh and discovery, for a node neither the config nor the
// discovery source names yet, it waits for the source to announce it.
func (m *Membership) WaitUp(ctx context.Context, name string) (*Peer, error) {
	if m.onDemand && !m.meshSlot(name) {
		return m.waitMember(ctx, name)
	}
	for {
		m.mu.Lock()
		s, ok := m.slots[name]
		if !ok {
			joined := m.joined
			m.mu.Unlock()
			if m.cfg.Discovery == nil {
				return nil, fmt.Errorf("%w: %q", ErrUnknownNode, name)
			}
			select {
			case <-joined:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("cluster: waiting for %s: %w", name, ctx.Err())
			case <-m.ctx.Done():
				return nil, ErrClosed
			}
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

// meshSlot reports whether the named node is kept by the mesh's rules
// (slot.mesh).
func (m *Membership) meshSlot(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slots[name]
	return s != nil && s.mesh
}

// waitMember waits until the named node is a member (gossip), then
// connects to it.
func (m *Membership) waitMember(ctx context.Context, name string) (*Peer, error) {
	for {
		m.mu.Lock()
		s, ok := m.slots[name]
		known := ok && s.alive
		joined := m.joined
		m.mu.Unlock()
		if known {
			p, err := m.connect(ctx, name, nil)
			if err == nil || ctx.Err() != nil {
				return p, err
			}
			if _, ok := ctx.Deadline(); !ok {
				return nil, err // connect's own deadline passed
			}
			continue // it left meanwhile, or a dial failed: wait on
		}
		select {
		case <-joined:
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
func (m *Membership) upgrade(ctx context.Context, nc net.Conn, peer wire.Remote, initiator bool) (net.Conn, error) {
	if !peer.SharedMemory {
		return nc, nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	c, err := m.shmLimits.Upgrade(ctx, nc, m.shm, initiator, peer.Node)
	switch {
	case err == nil:
		m.log.Debug("control connection on shared memory", zap.String("peer", peer.Node))
		return c, nil
	case errors.Is(err, shm.ErrRefused):
		m.log.Info("control connection stays on its socket: shared memory refused", zap.String("peer", peer.Node), zap.Error(err))
		return nc, nil
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
	var tieBreak, duplicate, busy bool
	var accepting *slot // set when this connection passed the tie-break
	hc.Admit = func(p wire.Remote) error {
		if !m.Known(p.Node) {
			admitErr = m.notMember(p.Node)
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
		if s == nil || !s.alive {
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("node %q is not a member of cluster %q at node %q (yet)", p.Node, m.cfg.Cluster, m.self.Name)}
			return admitErr
		}
		if !s.mesh && s.inc != p.Incarnation {
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("node %s knows incarnation %d of %s, not %d (yet)", m.self.Name, s.inc, p.Node, p.Incarnation)}
			return admitErr
		}
		if s.dialing && m.self.Name < p.Node {
			tieBreak = true
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("both ends dialed; the connection dialed by %s wins", m.self.Name)}
			return admitErr
		}
		// A connection that attach would close as a duplicate is refused
		// now, before the shared-memory upgrade.
		if s.cur != nil && s.cur.Incarnation == p.Incarnation && m.duplicate(s.cur, p.Node) {
			duplicate = true
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("%s already has a connection from this incarnation of %s", m.self.Name, p.Node)}
			return admitErr
		}
		// One inbound control connection of a peer is set up at a time:
		// each may make a shared-memory region (a file in /dev/shm and
		// five descriptors) until its upgrade ends, so 400 concurrent
		// dials under one name would hold hundreds of MB.
		if s.accepting {
			busy = true
			admitErr = &wire.ConnError{Code: wire.CodeUnavailable,
				Reason: fmt.Sprintf("%s is setting up another connection from %s", m.self.Name, p.Node)}
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
			accepting.signal()
			m.forgetIfGone(accepting)
			m.mu.Unlock()
		}
		switch {
		case tieBreak:
			m.log.Info("inbound connection refused: own dial to it in flight", zap.String("remote", remote))
		case duplicate:
			m.log.Info("duplicate connection refused", zap.String("remote", remote))
		case busy:
			m.log.Info("connection refused: another from the same node is being set up", zap.String("remote", remote))
		case stopping(admitErr):
			// This node stops: a peer redialing meanwhile is expected.
			m.log.Debug("connection refused: node stopping", zap.String("purpose", purpose), zap.String("remote", remote))
		case notAliveYet(admitErr):
			// Gossip has not shown this node the dialer alive yet: the
			// dialer retries; expected while a cluster starts.
			m.log.Info("connection refused", zap.String("purpose", purpose), zap.String("remote", remote), zap.String("reason", admitErr.Error()))
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
		} else if peerClosed(err) { // the peer stopped or dropped it meanwhile: it redials if it still wants to
			m.log.Info("shared memory upgrade ended: the peer closed the connection", zap.String("peer", peer.Node), zap.String("remote", remote), zap.Error(err))
		} else {
			m.log.Warn("shared memory upgrade failed", zap.String("peer", peer.Node), zap.String("remote", remote), zap.Error(err))
		}
		m.mu.Lock()
		accepting.accepting = false
		accepting.signal()
		m.forgetIfGone(accepting)
		m.mu.Unlock()
		return
	}
	m.attach(nc, peer, peer.Node)
}

// notMember is the refusal of a connection from name, which is not a live
// member here: for good (CodeNotFound) when neither the config nor the
// discovery source names it; to retry (CodeUnavailable) when one does but
// gossip has not shown this node it alive yet, or shows it gone, or (the
// full mesh) the discovery source reported it gone.
func (m *Membership) notMember(name string) error {
	_, inConfig := m.cfg.Node(name)
	m.mu.Lock()
	_, announced := m.seeds[name]
	m.mu.Unlock()
	if !inConfig && !announced {
		return &wire.ConnError{Code: wire.CodeNotFound,
			Reason: fmt.Sprintf("node %q is not in the config of cluster %q at node %q", name, m.cfg.Cluster, m.self.Name)}
	}
	why := reasonNotAliveYet
	if !m.onDemand {
		why = reasonGoneFromDiscovery
	}
	return &wire.ConnError{Code: wire.CodeUnavailable,
		Reason: fmt.Sprintf("node %q of cluster %q is not a live member at node %q yet: %s", name, m.cfg.Cluster, m.self.Name, why)}
}

// The reasons that end notMember's refusal to retry.
const (
	reasonNotAliveYet       = "its gossip has not shown it alive (a node that does not gossip, such as a Python node, is marked mesh_only in the config)"
	reasonGoneFromDiscovery = "discovery reported it gone, and has not announced it again"
)

// notAliveYet reports whether err is notMember's refusal of a configured
// or announced node that gossip has not shown alive yet, or that
// discovery reported gone (the dialer retries: expected while a cluster
// starts or a node comes back, so not a warning).
func notAliveYet(err error) bool {
	var ce *wire.ConnError
	return errors.As(err, &ce) && ce.Code == wire.CodeUnavailable &&
		(strings.HasSuffix(ce.Reason, reasonNotAliveYet) || strings.HasSuffix(ce.Reason, reasonGoneFromDiscovery))
}

// peerClosed reports whether err says that the other end closed or reset
// the connection: what a peer that stops does, not a fault to warn of.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// stopping reports whether err is the handshake refusal of a node that
// stops (CodeShutdown).
func stopping(err error) bool {
	var ce *wire.ConnError
	return errors.As(err, &ce) && ce.Code == wire.CodeShutdown
}

// reserveData counts a data connection from p against the bounds, or says
// why it is refused: p is not a member now (no control connection from this
// incarnation of it) or holds too many.
func (m *Membership) reserveData(p wire.Remote) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.slots[p.Node]
	switch {
	case m.closed:
		return &wire.ConnError{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"}
	case s == nil || s.cur == nil || s.cur.Incarnation != p.Incarnation:
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
	s := m.slots[node]
	s.dataConns--
	m.dataConns--
	m.forgetIfGone(s)
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
func (m *Membership) serveData(peer wire.Remote, nc net.Conn) {
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
	m.mu.Lock()
	s, ok := m.slots[node]
	var addr string
	if ok {
		addr = s.cfg.DataAddress
	}
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, node)
	}
	if err := config.CheckChannelName(channel); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	nc, err := m.net.DialContext(dctx, addr)
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

// startDialer starts the dialLoop of s (the full mesh) unless one runs;
// m.mu is held.
func (m *Membership) startDialer(s *slot) {
	if s.dialer || m.closed {
		return
	}
	s.dialer = true
	m.wg.Add(1)
	go m.dialLoop(s.cfg.Name)
}

// dialLoop keeps the named node of the full mesh connected: it dials
// while there is no connection to it, with backoff, until the node is
// reported gone by discovery (evicted) or the membership closes.
func (m *Membership) dialLoop(name string) {
	defer m.wg.Done()
	backoff := m.cfg.ReconnectMin
	for {
		m.mu.Lock()
		s := m.slots[name] // kept while s.dialer (forgetIfGone)
		if s.evicted {
			// Dialed again once announced again (discover.go).
			s.dialer = false
			m.forgetIfGone(s)
			m.mu.Unlock()
			return
		}
		cur, changed, nc := s.cur, s.changed, s.cfg
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
		err := m.dial(nc)
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

// attach makes nc the peer's control connection. With the full mesh a
// connection to the same incarnation never replaces one that is up (no
// flapping); one that is not up yet gives way to the connection dialed by
// the node with the smaller name. With gossip membership a connection to
// the incarnation already known becomes the Peer's next link, once the
// link it closed for idleness has finished.
func (m *Membership) attach(nc net.Conn, wp wire.Remote, initiator string) {
	if initiator != m.self.Name {
		defer func() {
			m.mu.Lock()
			if s := m.slots[wp.Node]; s != nil {
				s.accepting = false
				m.forgetIfGone(s)
			}
			m.mu.Unlock()
			m.wake(wp.Node)
		}()
	}
	l := &link{transport: transportOf(nc), addr: remoteAddr(nc), heard: make(chan struct{})}
	var p *Peer // set by placeLink before the connection starts
	l.conn = wire.NewConn(nc, wp, wire.ConnOptions{
		MaxFrameSize: uint32(m.transport.MaxFrameSize),
		SendQueue:    m.transport.SendQueue,
		DirectWrite:  m.transport.DirectWrite.On(true),
		// Handlers may run actor code on the reader (inline delivery,
		// actor.Node.WithInlineDelivery):
		// one that blocks hands the reading to a new goroutine.
		HandlerTakeover: m.transport.HandlerTakeover,
		// Handler.HandleFrame's frame is valid only during the call.
		TransientMessages: true,
		ReadSpin:          m.readSpin,
		ReadSpinInPoller:  !m.transport.ReadSpinDetach.On(true),
		CallerReads:       callerReads(m.transport.CallerReads),
		Logger:            m.log,
		Handler:           func(f wire.Frame) { m.frame(p, l, f) },
		OnClose:           func(err error) { m.connClosed(p, l, err) },
	})
	p, old, ok := m.placeLink(nc, l, wp, initiator)
	if !ok {
		_ = l.conn.Close(ErrClosed)
		return
	}
	m.wake(wp.Node)
	if old != nil {
		reason := errors.New("replaced by a new connection")
		if old.Incarnation != wp.Incarnation {
			reason = fmt.Errorf("restarted as incarnation %d", wp.Incarnation)
		}
		m.down(old, reason)
		if c := old.conn(); c != nil {
			_ = c.Close(reason)
		}
	}
	// Caps are queued before the connection starts: once the peer's caps
	// arrive (the reader runs from Start on) this node may send messages,
	// and they must not overtake its own caps.
	if err := l.conn.Send(m.ctx, wire.FrameCaps, 0, 0, &wire.Caps{Body: m.caps}); err != nil {
		l.conn.Fail(err)
	}
	l.conn.Start()
}

// placeLink decides which Peer a new authenticated control connection
// serves: a new Peer (replacing old, which the caller takes down), or with
// gossip membership the known Peer of that incarnation. It returns ok
// false, with nc closed, when the connection is refused.
func (m *Membership) placeLink(nc net.Conn, l *link, wp wire.Remote, initiator string) (p, old *Peer, ok bool) {
	deadline := time.Now().Add(m.cfg.DialTimeout)
	proved := false // the current Peer was found silent (answers)
	for {
		m.mu.Lock()
		s := m.slots[wp.Node]
		switch {
		case m.closed:
			m.mu.Unlock()
			// The peer's handshake succeeded: say goodbye, as Close does to
			// the peers it knew, so that it does not see a failure.
			_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_ = wire.NewFramer(nc, nil).WriteBody(wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"})
			return nil, nil, false
		case s == nil:
			m.mu.Unlock()
			m.log.Info("connection from a node that left refused", zap.String("peer", wp.Node))
			return nil, nil, false
		case s.mesh && s.evicted:
			// Discovery reported it gone while this connection was set
			// up (discover.go).
			m.mu.Unlock()
			m.log.Info("connection to a node gone from discovery closed", zap.String("peer", wp.Node))
			return nil, nil, false
		case wp.Incarnation < s.highest:
			live, liveAddr := s.highest, "(not connected now)"
			if l := s.curLink(); l != nil {
				liveAddr = l.addr
			}
			m.mu.Unlock()
			if m.incarnationWarn.Allow() {
				m.log.Error("connection from an older incarnation refused: the higher incarnation wins",
					zap.String("peer", wp.Node), zap.Uint64("incarnation", wp.Incarnation), zap.String("address", remoteAddr(nc)),
					zap.Uint64("live_incarnation", live), zap.String("live_address", liveAddr))
			}
			return nil, nil, false
		}
		cur := s.cur
		if s.mesh && cur != nil && cur.Incarnation != wp.Incarnation && !proved {
			// Another incarnation claims a node whose connection is up.
			// A restarted node's old process is dead, and its connection
			// silent; a live one sends heartbeats. The live, older
			// connection keeps its place if it proves itself so: a
			// holder of the secret cannot take a live node's name, and
			// with it raise the incarnation the real node is held to.
			m.mu.Unlock()
			if m.answers(cur) {
				if m.incarnationWarn.Allow() {
					m.log.Error("connection refused: it claims a node whose connection is live",
						zap.String("peer", wp.Node), zap.Uint64("incarnation", wp.Incarnation), zap.String("address", remoteAddr(nc)),
						zap.Uint64("live_incarnation", cur.Incarnation))
				}
				return nil, nil, false
			}
			proved = true // cur is silent: replaced below, if still current
			continue
		}
		if cur != nil && cur.Incarnation == wp.Incarnation {
			if !s.mesh {
				if cur.link.Load() == nil {
					cur.setLink(l)
					m.mu.Unlock()
					return cur, nil, true
				}
				if cur.gate.Load()&gateDrain != 0 && time.Now().Before(deadline) {
					// The link it replaces is closing for idleness: its
					// frames are delivered first.
					changed := s.changed
					m.mu.Unlock()
					t := time.NewTimer(time.Until(deadline))
					select {
					case <-changed:
					case <-t.C:
					case <-m.ctx.Done():
					}
					t.Stop()
					continue
				}
				m.mu.Unlock()
				m.log.Info("duplicate connection closed", zap.String("peer", wp.Node))
				return nil, nil, false
			}
			if m.keeps(cur, initiator) {
				m.mu.Unlock()
				m.log.Info("duplicate connection closed", zap.String("peer", wp.Node))
				return nil, nil, false
			}
		}
		p = &Peer{Name: wp.Node, Incarnation: wp.Incarnation, initiator: initiator, mesh: s.mesh, up: make(chan struct{}), m: m}
		p.setLink(l)
		if cur != nil {
			cur.gone.Store(true)
		}
		s.cur = p
		s.highest = max(s.highest, wp.Incarnation)
		m.mu.Unlock()
		return p, cur, true
	}
}

// answers reports whether p, a Peer of the full mesh, shows it is alive:
// it receives a frame (heartbeats come every heartbeat interval) within
// two heartbeat intervals, and is not taken down meanwhile.
func (m *Membership) answers(p *Peer) bool {
	n := p.frames.Load()
	wait := 2 * m.cfg.HeartbeatInterval
	tick := time.NewTicker(max(wait/16, time.Millisecond))
	defer tick.Stop()
	end := time.NewTimer(wait)
	defer end.Stop()
	for {
		if p.gone.Load() {
			return false
		}
		if p.frames.Load() != n {
			return true
		}
		select {
		case <-tick.C:
		case <-end.C:
			return p.frames.Load() != n && !p.gone.Load()
		case <-m.ctx.Done():
			return false
		}
	}
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

// wake tells whoever waits on the named node's slot (dialers, WaitUp,
// Connect, an accepted connection waiting for a link to close) that it
// changed.
func (m *Membership) wake(node string) {
	m.mu.Lock()
	if s := m.slots[node]; s != nil {
		s.signal()
	}
	m.mu.Unlock()
}

// signal closes and replaces s.changed; m.mu is held.
func (s *slot) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// curLink returns the link of the slot's current Peer, if any; m.mu is
// held.
func (s *slot) curLink() *link {
	if s.cur == nil {
		return nil
	}
	return s.cur.link.Load()
}

func (m *Membership) frame(p *Peer, l *link, f wire.Frame) {
	p.frames.Add(1)
	switch f := f.(type) {
	case *wire.CapsFrame:
		first := false
		p.upOnce.Do(func() { first = true })
		if first {
			p.Caps = append([]byte(nil), f.Caps.Body...)
			// The handler learns first, so that a WaitUp that returns finds
			// the peer ready everywhere.
			m.log.Info("node up", zap.String("peer", p.Name), zap.Uint64("incarnation", p.Incarnation))
			m.h.PeerUp(p)
			m.mu.Lock()
			s := m.slots[p.Name]
			current := s != nil && s.cur == p
			if current {
				p.isUp.Store(true)
				close(p.up)
				s.signal()
			}
			m.mu.Unlock()
			if !current {
				m.h.PeerDown(p, errors.New("connection replaced or closed while coming up"))
			}
		}
	case *wire.PingFrame:
		_ = l.conn.Send(m.ctx, wire.FramePong, 0, 0, &wire.Pong{Seq: f.Ping.Seq, UnixNano: f.Ping.UnixNano})
	case *wire.PongFrame:
	case *wire.GoAwayFrame:
		if f.GoAway.Code == wire.CodeIdle && !p.mesh {
			m.heardIdle(p, l)
			return
		}
		m.log.Info("peer goes away", zap.String("peer", p.Name), zap.String("reason", f.GoAway.Reason))
		l.conn.End(fmt.Errorf("%w: peer goes away: %s", ErrNodeDown, f.GoAway.Reason))
	default:
		if p.isUp.Load() {
			m.h.HandleFrame(p, f)
		} else {
			l.conn.Fail(fmt.Errorf("cluster: %v frame before capabilities", f.Header().Type))
		}
	}
}

// connClosed runs when one of p's links closed. A link closed for
// idleness leaves p up (gossip membership); any other end takes p down.
func (m *Membership) connClosed(p *Peer, l *link, err error) {
	if p == nil {
		return // refused before it served a Peer
	}
	if !p.mesh && l.idleDone() {
		p.link.CompareAndSwap(l, nil)
		p.gate.And(^gateDrain)
		m.log.Debug("idle control connection closed", zap.String("peer", p.Name))
		m.wake(p.Name)
		return
	}
	if m.retire(p) {
		m.down(p, err)
	}
}

// retire makes p no longer its node's current Peer, reporting whether it
// was.
func (m *Membership) retire(p *Peer) bool {
	m.mu.Lock()
	s := m.slots[p.Name]
	current := s != nil && s.cur == p
	if current {
		s.cur = nil
		s.signal()
	}
	m.mu.Unlock()
	p.gone.Store(true)
	return current
}

// dropPeer takes p down without a connection of its own to close (gossip
// membership: the node left, or p is idle and its Close was called).
func (m *Membership) dropPeer(p *Peer, cause error) {
	current := m.retire(p)
	if c := p.conn(); c != nil {
		c.Fail(cause)
	}
	if current {
		m.down(p, cause)
	}
}

// keeps reports whether old, the current connection to its peer, stays
// when another one of the same incarnation, dialed by initiator, comes:
// one that is up never gives way (no flapping), one that is not yet up
// gives way to the connection dialed by the node with the smaller name,
// and one that is closing always does. m.mu is held.
func (m *Membership) keeps(old *Peer, initiator string) bool {
	select {
	case <-old.link.Load().conn.Done():
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

// down reports p down if it had come up, once.
func (m *Membership) down(p *Peer, cause error) {
	select {
	case <-p.up:
	default:
		return
	}
	first := false
	p.downOnce.Do(func() { first = true })
	if !first {
		return
	}
	m.log.Info("node down", zap.String("peer", p.Name), zap.Uint64("incarnation", p.Incarnation), zap.Error(cause))
	m.h.PeerDown(p, cause)
}

// silenceChecks is how many times per failure timeout the heartbeat loop
// looks for silent peers: a node that stops answering is declared down
// within FailureTimeout × (1 + 1/silenceChecks) of its last frame, not
// up to a whole heartbeat interval later (and, as lastSeen may be one
// check early, not before FailureTimeout × (1 − 1/silenceChecks)).
const silenceChecks = 30

func (m *Membership) heartbeatLoop() {
	defer m.wg.Done()
	// The loop ticks k times per heartbeat interval, often enough to look
	// for silence silenceChecks times per failure timeout; a heartbeat goes
	// out every k-th tick.
	hb, ft := m.cfg.HeartbeatInterval, m.cfg.FailureTimeout
	k := max(1, int((hb*silenceChecks+ft-1)/ft))
	t := time.NewTicker(hb / time.Duration(k))
	defer t.Stop()
	var seq uint64
	prev := mono.Now() // the previous check: frames counted since came after it
	for tick := 0; ; tick++ {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			check := mono.Now()
			ping := tick%k == 0
			if ping {
				seq++
			}
			m.mu.Lock()
			var peers []*Peer
			for _, s := range m.slots {
				if s.cur != nil && s.mesh {
					peers = append(peers, s.cur)
				}
			}
			m.mu.Unlock()
			for _, p := range peers {
				// Frames counted since the previous check came after it;
				// a peer's first check only takes the count (its link's
				// start stamped lastSeen).
				if n := p.frames.Load(); n != p.framesAt || !p.checked {
					for v := p.lastSeen.Load(); p.checked && v < prev; v = p.lastSeen.Load() {
						if p.lastSeen.CompareAndSwap(v, prev) { // not behind a new link's stamp
							break
						}
					}
					p.framesAt, p.checked = n, true
				}
				if silent := time.Duration(check - p.lastSeen.Load()); silent > m.cfg.FailureTimeout {
					p.conn().Fail(fmt.Errorf("%w: silent for %v (failure timeout %v)", ErrNodeDown, silent.Round(time.Millisecond), m.cfg.FailureTimeout))
					continue
				}
				if !ping {
					continue
				}
				ctx, cancel := context.WithTimeout(m.ctx, m.cfg.HeartbeatInterval)
				_ = p.conn().Send(ctx, wire.FramePing, 0, 0, &wire.Ping{Seq: seq, UnixNano: now.UnixNano()})
				cancel()
			}
			prev = check
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
		c := p.conn()
		if c == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if c.Send(ctx, wire.FrameGoAway, 0, 0, &wire.GoAway{Code: wire.CodeShutdown, Reason: "node " + m.self.Name + " shutting down"}) == nil {
			_ = c.Flush(ctx)
		}
		cancel()
	}
	m.stopDiscovery()
	m.leaveGossip()
	m.cancel()
	for _, l := range lns {
		l.Close()
	}
	for _, p := range peers {
		if c := p.conn(); c != nil {
			_ = c.Close(ErrClosed)
		}
		m.dropPeer(p, ErrClosed) // an idle one (gossip) has no connection to close
	}
	m.wg.Wait()
	m.stopGossip()
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

// callerReads is wire.ConnOptions.CallerReads for the config's switch:
// the default linger, or -1 (callers never read) when it is off.
func callerReads(s config.Switch) time.Duration {
	if s.On(true) {
		return 0
	}
	return -1
}
