package transfer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// Errors of the engine.
var (
	// ErrPeerDown fails what waits on a peer that went down.
	ErrPeerDown = errors.New("transfer: peer down")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("transfer: engine closed")
	// ErrNoChannel: no data channel can move a tensor between the owner's
	// and the receiver's devices.
	ErrNoChannel = errors.New("transfer: no data channel for this transfer")
	// ErrOverBudget: a message's tensors exceed what the receiver allows
	// one peer to have allocated at once (Config.PeerBudget).
	ErrOverBudget = errors.New("transfer: tensors exceed the receiver's budget")
	// ErrInboxFull: the receiver's inbox for the sending peer is full (the
	// sender ignored the window the receiver advertised).
	ErrInboxFull = errors.New("transfer: receiver's inbox for this peer is full")
	// ErrControl wraps errors reported by a peer's channel to a control
	// request.
	ErrControl = errors.New("transfer: channel control request failed")
)

// Link is the engine's view of a peer's control connection
// (*cluster.Peer implements it).
type Link interface {
	// Send queues a frame to the peer; it blocks while the connection's
	// queue is full, until ctx is done.
	Send(ctx context.Context, t wire.FrameType, flags wire.Flags, stream uint32, body any) error
	// Close starts closing the connection with the given cause.
	Close(cause error)
}

// ChannelFactory makes one data channel for a node, replacing the
// registered backend's constructor of the same name.
type ChannelFactory func(env *rdma.Env) (rdma.Channel, error)

// Config is what an engine needs from its node: who the node is, how to
// reach its peers, and its tuning, the node's config sections. Zero
// tuning fields take the defaults of package config.
type Config struct {
	Node        string
	Incarnation uint64
	// Devices are the node's configured devices; the first is the default
	// destination of received tensors (cpu when empty).
	Devices []memory.Device
	// Disabled reports the channels the node must not run.
	Disabled func(channel string) bool
	// Channels replaces the constructors of registered channels.
	Channels map[string]ChannelFactory
	// InlineThreshold: tensors of at most this many bytes are copied into
	// the message's table instead of exported (config.TransportConfig's
	// InlineThreshold).
	InlineThreshold int64
	// InlineDevice keeps GPU tensors at or below InlineThreshold inline
	// for every peer. By default such a tensor goes to a peer of the same
	// host through a channel that moves small device tensors faster than
	// inline copies (rdma.DirectSmall: ipc), when that channel reaches
	// each of the peer's GPUs: the receiver copies it device to device
	// instead of both ends bouncing it through host memory.
	InlineDevice bool
	// Flow bounds what is in flight: fetch deadlines and leases, the
	// sender's credits, the receiver's budgets, window and inboxes (see
	// config.FlowConfig; a zero ReceiveBudget is DefaultBudget of Devices).
	Flow config.FlowConfig
	// Staging, IPC and Verbs configure the channels of those names,
	// through their rdma.Env.
	Staging config.StagingConfig
	IPC     config.IPCConfig
	Verbs   config.VerbsConfig
	// Dial opens an authenticated data connection to a peer's channel.
	Dial func(ctx context.Context, node, channel string) (net.Conn, error)
	// HostID replaces the host identity the node advertises
	// (memory.HostID), for tests in which nodes of one process stand for
	// several hosts: channels that need one host (ipc) are then not
	// chosen between nodes of different HostIDs, and relay plans one
	// fetch per host.
	HostID string
	Log    *zap.Logger
	// TracerProvider makes the spans of exports and fetches (see
	// ExportContext, ImportContext); nil (the default) makes none.
	TracerProvider trace.TracerProvider
}

// maxStrikes is how many messages beyond its window a peer may send
// before its connection is closed.
const maxStrikes = 64

// DefaultBudget returns the default receive budget of a node with the
// given devices: half the memory of its smallest GPU, or a quarter of the
// host's memory for a node without GPUs, and at least 256 MiB.
func DefaultBudget(devs []memory.Device) int64 {
	var b int64
	for _, d := range devs {
		if d.Kind != memory.KindCUDA {
			continue
		}
		if total, err := memory.CUDATotalMemory(d); err == nil && (b == 0 || total/2 < b) {
			b = total / 2
		}
	}
	if b == 0 {
		b = memory.HostMemory() / 4
	}
	return max(b, 256<<20)
}

func (c *Config) setDefaults() {
	if c.InlineThreshold <= 0 {
		c.InlineThreshold = int64(config.DefaultTransportConfig().InlineThreshold)
	}
	c.Flow = c.Flow.WithDefaults()
	f := &c.Flow
	if f.ReceiveBudget <= 0 {
		f.ReceiveBudget = DefaultBudget(c.Devices)
	}
	if f.ReceiveBudgetPerPeer <= 0 {
		f.ReceiveBudgetPerPeer = f.ReceiveBudget / 2
	}
	f.ReceiveBudgetPerPeer = min(f.ReceiveBudgetPerPeer, f.ReceiveBudget)
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
}

// Engine is a node's tensor path: it takes the tensors out of outgoing
// messages (Export), puts them back into incoming ones (Import, Enqueue),
// moves their bytes through the data channels, and bounds what both ends
// hold. It imports nothing of the actor system; the node reaches it
// through the methods below and it reaches the node's peers through Link.
type Engine struct {
	cfg      Config
	log      *zap.Logger
	tr       tracehook.Tracer
	store    *tensor.Store
	channels map[string]rdma.Channel
	caps     rdma.Caps
	device   memory.Device // default destination

	budget *budget // all peers together

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	peers    map[string]*PeerFlow
	peerSnap atomic.Pointer[map[string]*PeerFlow]
	closed   bool

	flowMu sync.Mutex
	flow   map[uint64]*inFlight // export id → its message's credit

	ctlSeq  atomic.Uint64
	ctlMu   sync.Mutex
	ctlWait map[uint64]ctlWaiter

	stats Stats
	// relays are the fetches of contents in flight that others may join
	// (relay.go).
	relays relays
}

// New makes the engine of a node; Start opens its channels.
func New(cfg Config) *Engine {
	cfg.setDefaults()
	e := &Engine{
		cfg:     cfg,
		log:     cfg.Log,
		tr:      tracehook.New(cfg.TracerProvider, "github.com/tensorferry/tensorferry/transfer", cfg.Node),
		store:   tensor.NewStore(cfg.Node, cfg.Incarnation),
		peers:   map[string]*PeerFlow{},
		flow:    map[uint64]*inFlight{},
		ctlWait: map[uint64]ctlWaiter{},
		device:  memory.CPU,
	}
	if len(cfg.Devices) > 0 {
		e.device = cfg.Devices[0]
	}
	e.budget = newBudget(cfg.Flow.ReceiveBudget)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.store.OnEnd(e.exportEnded)
	return e
}

// Start opens the node's data channels and builds the capabilities it
// advertises (Advert).
func (e *Engine) Start() error {
	env := &rdma.Env{
		Node:        e.cfg.Node,
		Incarnation: e.cfg.Incarnation,
		Store:       e.store,
		Log:         e.log,
		Dial:        e.cfg.Dial,
		Control:     e.control,
		Staging:     e.cfg.Staging,
		IPC:         e.cfg.IPC,
		Verbs:       e.cfg.Verbs,
		Served:      e.stats.addServed,
	}
	channels, caps, err := openChannels(env, &e.cfg)
	if err != nil {
		return err
	}
	e.channels, e.caps = channels, caps
	return nil
}

// Close fails what is in flight and releases every resource.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	peers := make([]*PeerFlow, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	e.mu.Unlock()
	e.cancel()
	for _, p := range peers {
		p.shutdown()
	}
	e.wg.Wait()
	for _, ch := range e.channels {
		_ = ch.Close()
	}
	e.store.Close()
}

// Store returns the node's table of exported tensors.
func (e *Engine) Store() *tensor.Store { return e.store }

// Caps returns what this node advertises.
func (e *Engine) Caps() rdma.Caps { return e.caps }

// Device returns the default destination of received tensors.
func (e *Engine) Device() memory.Device { return e.device }

// advert is what a node sends its peers after the handshake: its
// capabilities and the window of its inbox, which a sender's credits
// respect.
type advert struct {
	Caps        rdma.Caps `msgpack:"c"`
	WindowMsgs  int       `msgpack:"w"`
	WindowBytes int64     `msgpack:"wb"`
	// Relay: the node serves its copies of contents to other receivers
	// (relay control requests, relay.go); an owner names only such
	// nodes in its descriptors' Relay.
	Relay bool `msgpack:"r,omitempty"`
}

// Advert returns the body a node sends its peers after the handshake.
func (e *Engine) Advert() ([]byte, error) {
	return wire.EncodeMsgpack(&advert{Caps: e.caps, WindowMsgs: e.cfg.Flow.ReceiveWindow, WindowBytes: e.cfg.Flow.ReceiveBudgetPerPeer, Relay: !e.cfg.Flow.NoRelay})
}

// decodeAdvert decodes the advert of the named peer's incarnation.
func decodeAdvert(body []byte, name string, incarnation uint64) (advert, error) {
	var a advert
	if err := wire.DecodeMsgpack(body, &a); err != nil {
		return advert{}, fmt.Errorf("transfer: bad capabilities from %s: %w", name, err)
	}
	if a.Caps.Node != name || a.Caps.Incarnation != incarnation {
		return advert{}, fmt.Errorf("transfer: capabilities of %s name %s#%d", name, a.Caps.Node, a.Caps.Incarnation)
	}
	if a.WindowMsgs < 0 || a.WindowBytes < 0 {
		return advert{}, fmt.Errorf("transfer: capabilities of %s: negative window", name)
	}
	return a, nil
}

// PeerFlow is what the engine keeps for one peer that is up: the flow
// of its tensor messages (credits, inbox, outbox, receive budget). Not
// cluster.Peer, the node as membership sees it.
type PeerFlow struct {
	name string
	link Link
	caps rdma.Caps

	credits *credits // for tensor messages sent to it
	inbox   inbox    // its messages waiting for their tensors
	out     outbox   // messages to it waiting for credits
	budget  *budget  // what its messages hold allocated
	done    chan struct{}
	strikes atomic.Int64
	// ctlSlots holds one token per control request of the peer being
	// handled (MaxControlPerPeer).
	ctlSlots chan struct{}
	// relay: the peer serves relay requests (advert.Relay).
	relay bool
}

func (p *PeerFlow) shutdown() {
	select {
	case <-p.done:
	default:
		close(p.done)
	}
}

// PeerUp starts the engine's state for a peer whose advert (the body its
// node sent after the handshake) is given, and returns it (the node keeps
// it for the per-message checks, Backlogged and Backlog); an error means
// the advert is not acceptable and the connection should be closed.
func (e *Engine) PeerUp(name string, incarnation uint64, body []byte, link Link) (*PeerFlow, error) {
	a, err := decodeAdvert(body, name, incarnation)
	if err != nil {
		return nil, err
	}
	msgs, bytes := e.cfg.Flow.MaxInFlight, e.cfg.Flow.MaxInFlightBytes
	if a.WindowMsgs > 0 {
		msgs = min(msgs, a.WindowMsgs)
	}
	if a.WindowBytes > 0 {
		bytes = min(bytes, a.WindowBytes)
	}
	p := &PeerFlow{name: name, link: link, caps: a.Caps, credits: newCredits(msgs, bytes),
		budget: newBudget(e.cfg.Flow.ReceiveBudgetPerPeer), done: make(chan struct{}),
		ctlSlots: make(chan struct{}, MaxControlPerPeer), relay: a.Relay}
	p.inbox.init(e.cfg.Flow.InboxMessages, e.cfg.Flow.InboxBytes, e.cfg.Flow.ReceiveWindow)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	if old := e.peers[name]; old != nil {
		old.shutdown()
	}
	e.peers[name] = p
	e.publishPeers()
	e.wg.Add(1)
	e.mu.Unlock()
	go e.deliverLoop(p)
	return p, nil
}

// PeerDown fails everything that waits on the named peer: its queued
// messages are aborted, its transfers fail, the leases it held are
// released, its channels' state is dropped. It returns the leases
// released.
func (e *Engine) PeerDown(name string) int {
	e.mu.Lock()
	p := e.peers[name]
	if p != nil {
		delete(e.peers, name)
		e.publishPeers()
	}
	e.mu.Unlock()
	if p != nil {
		p.shutdown()
	}
	for _, ch := range e.channels {
		ch.PeerDown(name)
	}
	released := e.store.ReleaseHolder(name)
	e.failControls(name)
	return released
}

// peer returns the state of the named peer if it is up, without locking.
func (e *Engine) peer(name string) *PeerFlow {
	if m := e.peerSnap.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// publishPeers copies e.peers into the snapshot peer reads; e.mu is held.
func (e *Engine) publishPeers() {
	m := maps.Clone(e.peers)
	e.peerSnap.Store(&m)
}

// PeerCaps returns what the named peer advertised, if it is up.
func (e *Engine) PeerCaps(name string) (rdma.Caps, bool) {
	if p := e.peer(name); p != nil {
		return p.caps, true
	}
	return rdma.Caps{}, false
}

// HandleRelease ends the lease a peer gives back.
func (e *Engine) HandleRelease(peer string, r *wire.Release) {
	if r.Incarnation != e.cfg.Incarnation {
		e.log.Warn("release for another incarnation", zap.String("peer", peer), zap.Uint64("incarnation", r.Incarnation))
		return
	}
	if err := e.store.Release(r.ExportID, r.Lease); err != nil {
		e.log.Warn("release refused", zap.String("peer", peer), zap.Error(err))
	}
}

// HandleDataConn hands an authenticated data connection to its channel.
func (e *Engine) HandleDataConn(peer, channel string, conn net.Conn) {
	ch, ok := e.channels[channel].(rdma.ConnServer)
	if !ok {
		e.log.Warn("data connection for a channel that takes none", zap.String("peer", peer), zap.String("channel", channel))
		conn.Close()
		return
	}
	ch.ServeConn(conn, peer)
}
