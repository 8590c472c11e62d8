package actor

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/extensions"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/fastpath"
	"github.com/tensorferry/tensorferry/internal/tracehook"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/transfer"
	"go.uber.org/zap"
)

// Errors returned by a Node.
var (
	// ErrNodeDown is reported when the node an actor lives on is not up.
	ErrNodeDown = cluster.ErrNodeDown
	// ErrStopped is returned after Stop.
	ErrStopped = errors.New("actor: node stopped")
	// ErrAttached: the ActorSystem has a node attached already.
	ErrAttached = errors.New("actor: a tensorferry node is attached to this ActorSystem already")
)

// ChannelFactory makes one data channel for a node, in place of the
// constructor of the backend registered under its name (rdma.Register).
type ChannelFactory = transfer.ChannelFactory

// Option configures a Node.
type Option func(*options)

type options struct {
	log               *zap.Logger
	engine            transfer.Config // Channels, and the Flow fields options override
	system            []pa.ConfigOption
	lendCheck         bool
	noRemoteLifecycle bool
	shm               shm.Config // WithSharedMemory
}

// WithoutRemoteLifecycle makes the node refuse Stop, Poison and PoisonPill
// sent by other nodes to any of its actors (they are logged, and a sender
// waiting on a PoisonPill gets a failure). By default, as in protoactor,
// any node of the cluster may stop any actor; the node's own actors (the
// ping actor) always refuse.
func WithoutRemoteLifecycle() Option { return func(o *options) { o.noRemoteLifecycle = true } }

// WithLendCheck turns on a debug check of lending: each tensor this node
// lends is checksummed when it is exported and again when its lease ends,
// and an owner that wrote it in between is reported (a warning in the log
// naming the export and the tensor, and StatsSnapshot.LendViolations). It
// costs a full read of every lent tensor (a device-to-host copy for GPU
// memory), twice: for debugging, not for production.
func WithLendCheck() Option { return func(o *options) { o.lendCheck = true } }

// WithLogger sets the node's logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithChannel makes the node build the channel registered under name (see
// rdma.Register) with f instead of its backend's constructor; it still runs
// only where that channel is viable and not disabled. Start fails with an
// error wrapping rdma.ErrUnknownChannel when no backend registers name.
func WithChannel(name string, f ChannelFactory) Option {
	return func(o *options) {
		if o.engine.Channels == nil {
			o.engine.Channels = map[string]transfer.ChannelFactory{}
		}
		o.engine.Channels[name] = f
	}
}

// WithHostID makes the node advertise id as its host's identity in place
// of memory.HostID, for tests in which nodes of one process stand for
// several hosts: channels that need one host (ipc) are not chosen between
// nodes of different ids, and fan-out by relay plans one fetch per host.
// Nodes of one real host must not differ in it on a GPU host, where they
// would lose ipc.
func WithHostID(id string) Option { return func(o *options) { o.engine.HostID = id } }

// WithRefTTL sets how long a lease lent through a tensor.Ref lasts when it is
// neither fetched nor released, in place of the config's flow.ref_ttl
// (config.FlowConfig.RefTTL, default 10 minutes). A value <= 0 keeps the
// config's.
func WithRefTTL(d time.Duration) Option { return func(o *options) { o.engine.Flow.RefTTL = d } }

// WithMaxInFlight bounds what a node has sent to one peer in messages with
// tensors to fetch that the peer has not fetched yet, in place of the
// config's flow.max_in_flight and flow.max_in_flight_bytes
// (config.FlowConfig: at most msgs such messages, default 64, holding at
// most bytes of those tensors, default 4 GiB; a larger message goes alone).
// The window each receiver advertises lowers both. Messages beyond them
// wait in the node's outbox for that peer (see Node's doc: a Send never
// blocks). Values <= 0 keep the config's.
func WithMaxInFlight(msgs int, bytes int64) Option {
	return func(o *options) {
		o.engine.Flow.MaxInFlight, o.engine.Flow.MaxInFlightBytes = msgs, bytes
	}
}

// WithSystemConfig passes options to the protoactor-go ActorSystem that
// NewNode makes (NewRemote attaches to a system made by the caller).
func WithSystemConfig(opts ...pa.ConfigOption) Option {
	return func(o *options) { o.system = append(o.system, opts...) }
}

// Node is one member of a tensorferry cluster attached to a protoactor-go
// ActorSystem: PIDs whose Address is another node's name work with
// protoactor's own API, over tensorferry's wire protocol, and messages may
// carry tensors, which the node's transfer engine moves out of band.
//
// A Send never blocks the sending actor: a message with tensors for a peer
// whose credits are out (it has not fetched earlier tensors) waits in the
// node's outbox for that peer, in order with the later messages to it, at
// most transfer_timeout and behind at most transfer.MaxOutbox others;
// beyond that its sender gets *DeliveryFailed (a waiting Request or future
// ErrDeadLetter).
//
// A send to an actor of the same node is protoactor's own local send: the
// receiver gets the message itself, and the sender's *Tensor with it — not
// lent (no lease: WaitReleased returns at once) and not placed on the
// receiving actor's device. Share it, or send a copy (Tensor.To) when the
// sender goes on writing.
type Node struct {
	cfg         *config.Config
	self        config.NodeConfig
	incarnation uint64
	log         *zap.Logger
	tr          tracehook.Tracer // see WithTracerProvider
	opts        options
	ownSystem   bool // made by NewNode: Stop shuts it down

	// lazyDecode: a burst's messages to an actor with inline delivery are
	// decoded by the actor's goroutine (lazyMessage); transport.burst_decode.
	// By default only with processors to spare (fastpath.Spare): on fewer,
	// the reader and the actor share them, and moving the decode costs
	// more than it frees (one-way throughput fell from 3.0–3.35 to
	// 1.8 M msg/s on 2 cores).
	lazyDecode atomic.Bool

	system   *pa.ActorSystem
	members  *cluster.Membership
	eng      *transfer.Engine
	onReader onReaderMailboxes
	replies  replies // Request calls waiting for their reply

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	peers    map[string]*peerState
	peerSnap atomic.Pointer[map[string]*peerState] // copy of peers, see peer
	// failedFutures: the futures PeerDown failed lately (claimFuture).
	failedFutures failedFutures
	remotes       map[string]*remoteProcess // other node → its process; fixed at attach
	watching      map[string]map[string]map[string]*pa.PID
	devices       map[string]memory.Device // local actor id → device
	dests         sync.Map                 // local actor id → transfer.Destinations (WithDestinations)
	// remoteWatchers are the watches other nodes' actors hold on this
	// node's actors (watch.go).
	remoteWatchers watchers
	stopped        bool

	stats   stats
	pingSeq atomic.Uint64
}

var extensionID = extensions.NextExtensionID()

// ExtensionID implements protoactor's extensions.Extension: a node is
// registered in its ActorSystem's Extensions (see GetNode).
func (n *Node) ExtensionID() extensions.ExtensionID { return extensionID }

// GetNode returns the node attached to system, or nil.
func GetNode(system *pa.ActorSystem) *Node {
	if system == nil || system.Extensions == nil {
		return nil
	}
	n, _ := system.Extensions.Get(extensionID).(*Node)
	return n
}

// NewRemote attaches the node named name of the cluster described by cfg
// (which must be valid) to an ActorSystem the caller made, the way
// protoactor's remote.NewRemote does: the system's address becomes the
// node's name, an address resolver routes PIDs of other nodes to it, and
// the node is registered in system.Extensions (GetNode finds it). Start
// brings it up; Stop leaves the system running.
func NewRemote(system *pa.ActorSystem, cfg *config.Config, name string, opts ...Option) (*Node, error) {
	if GetNode(system) != nil {
		return nil, ErrAttached
	}
	n, err := newNode(cfg, name, opts)
	if err != nil {
		return nil, err
	}
	n.attach(system)
	return n, nil
}

// NewNode makes an ActorSystem (with the options of WithSystemConfig) and
// attaches the node named name of the cluster described by cfg to it; Stop
// shuts both down.
func NewNode(cfg *config.Config, name string, opts ...Option) (*Node, error) {
	n, err := newNode(cfg, name, opts)
	if err != nil {
		return nil, err
	}
	n.ownSystem = true
	n.attach(pa.NewActorSystem(append([]pa.ConfigOption{systemLogger(n.log)}, n.opts.system...)...))
	return n, nil
}

func newNode(cfg *config.Config, name string, opts []Option) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	self, ok := cfg.Node(name)
	if !ok {
		return nil, fmt.Errorf("actor: %w: %q", cluster.ErrUnknownNode, name)
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = zap.NewNop()
	}
	n := &Node{
		cfg:         cfg,
		self:        self,
		incarnation: newIncarnation(),
		log:         o.log.With(zap.String("node", name)),
		tr:          tracehook.New(o.engine.TracerProvider, "github.com/tensorferry/tensorferry/actor", name),
		opts:        o,
		peers:       map[string]*peerState{},
		watching:    map[string]map[string]map[string]*pa.PID{},
		devices:     map[string]memory.Device{},
		remotes:     map[string]*remoteProcess{},
	}
	n.lazyDecode.Store(cfg.Transport.BurstDecode.On(fastpath.Spare()))
	for _, nc := range cfg.Nodes {
		if nc.Name != name {
			n.remotes[nc.Name] = &remoteProcess{n: n, node: nc.Name}
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	ec := o.engine
	ec.Node, ec.Incarnation = name, n.incarnation
	ec.Devices = self.Devices
	ec.Disabled = func(ch string) bool { return cfg.ChannelDisabled(name, ch) }
	ec.InlineThreshold = int64(cfg.Transport.InlineThreshold)
	ec.InlineDevice = cfg.Transport.InlineDevice
	ec.Flow = cfg.Flow
	if o.engine.Flow.RefTTL > 0 {
		ec.Flow.RefTTL = o.engine.Flow.RefTTL
	}
	if o.engine.Flow.MaxInFlight > 0 {
		ec.Flow.MaxInFlight = o.engine.Flow.MaxInFlight
	}
	if o.engine.Flow.MaxInFlightBytes > 0 {
		ec.Flow.MaxInFlightBytes = o.engine.Flow.MaxInFlightBytes
	}
	ec.Staging, ec.IPC, ec.Verbs = cfg.Staging, cfg.IPC, cfg.Verbs
	ec.Dial = n.dialData
	ec.Log = n.log
	n.eng = transfer.New(ec)
	if o.lendCheck {
		n.eng.Store().SetLendCheck(func(v tensor.LendViolation) {
			n.log.Warn("a lent tensor was written by its owner during the lease", zap.String("violation", v.String()))
		})
	}
	return n, nil
}

func (n *Node) attach(system *pa.ActorSystem) {
	n.system = system
	system.ProcessRegistry.Address = n.self.Name
	system.ProcessRegistry.RegisterAddressResolver(n.resolve)
	system.Extensions.Register(n)
}

func newIncarnation() uint64 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	// Time-ordered, so a restarted node always gets a larger incarnation,
	// with random low bits against two starts in one nanosecond tick.
	return uint64(time.Now().UnixNano())<<8>>8 | uint64(binary.LittleEndian.Uint16(b[:]))<<56>>56
}

// Start opens the node's listeners, starts its data channels and begins
// connecting to the other nodes of the cluster.
func (n *Node) Start() error {
	if err := n.setCUDACache(); err != nil {
		return err
	}
	if err := n.eng.Start(); err != nil {
		return err
	}
	body, err := n.eng.Advert()
	if err != nil {
		n.eng.Close()
		return err
	}
	m, err := cluster.NewMembership(n.cfg, n.self.Name, n.incarnation, (*handler)(n), cluster.Options{Logger: n.opts.log, Caps: body, SharedMemory: n.opts.shm})
	if err != nil {
		n.eng.Close()
		return err
	}
	n.members = m
	if err := m.Start(); err != nil {
		n.eng.Close()
		return err
	}
	if _, err := n.system.Root.SpawnNamed(pa.PropsFromFunc(pingReceive, n.WithInlineDelivery()), pingActor); err != nil {
		_ = m.Close()
		n.eng.Close()
		return fmt.Errorf("actor: spawning %s: %w", pingActor, err)
	}
	n.wg.Add(1)
	go n.sweepLoop()
	caps := n.eng.Caps()
	n.log.Info("node started", zap.String("address", n.self.Address), zap.Uint64("incarnation", n.incarnation),
		zap.Strings("channels", caps.Channels), zap.Stringer("device", n.eng.Device()))
	return nil
}

// setCUDACache applies the config's memory.cuda_cache_bytes to the caching
// allocator of each CUDA device of the node; 0 keeps the allocator's
// default. A device that cannot be opened is left to fail where it is used.
func (n *Node) setCUDACache() error {
	b := n.cfg.Memory.CUDACacheBytes
	if b <= 0 {
		return nil
	}
	for _, d := range n.self.Devices {
		if d.Kind != memory.KindCUDA {
			continue
		}
		a, err := memory.CUDAAllocatorFor(d)
		if err != nil {
			continue
		}
		if err := a.SetCacheBytes(b); err != nil {
			return fmt.Errorf("actor: memory.cuda_cache_bytes on %s: %w", d, err)
		}
	}
	return nil
}

// Name returns the node's name, which is also the Address of its PIDs.
func (n *Node) Name() string { return n.self.Name }

// Incarnation returns this process's incarnation of the node.
func (n *Node) Incarnation() uint64 { return n.incarnation }

// System returns the node's protoactor-go ActorSystem.
func (n *Node) System() *pa.ActorSystem { return n.system }

// Root returns the ActorSystem's root context.
func (n *Node) Root() *pa.RootContext { return n.system.Root }

// Device returns the default device of actors on this node.
func (n *Node) Device() memory.Device { return n.eng.Device() }

// PID returns the PID of actor id on the named node.
func (n *Node) PID(node, id string) *pa.PID { return pa.NewPID(node, id) }

// WaitPeer blocks until the named node is up or ctx is done.
func (n *Node) WaitPeer(ctx context.Context, node string) error {
	_, err := n.members.WaitUp(ctx, node)
	return err
}

// PeerError returns why the last attempt to connect to the named node
// failed (unreachable, handshake refused...), or nil.
func (n *Node) PeerError(node string) error { return n.members.LastError(node) }

// Topology is what a node knows of the data paths between itself and its
// peers: the capabilities each advertised. It is a copy.
type Topology struct {
	Self  rdma.Caps
	Peers map[string]rdma.Caps // peers that are up
}

// Topology returns what this node and the peers that are up advertise.
func (n *Node) Topology() Topology {
	t := Topology{Self: n.eng.Caps(), Peers: map[string]rdma.Caps{}}
	if m := n.peerSnap.Load(); m != nil {
		for name := range *m {
			if c, ok := n.eng.PeerCaps(name); ok {
				t.Peers[name] = c
			}
		}
	}
	return t
}

// Route returns the channel that would move a tensor of owner's device src
// to the device dst of the node whose Topology this is, with the reasons
// for the others.
func (t Topology) Route(owner string, src, dst memory.Device) (rdma.Choice, error) {
	oc := t.Self
	if owner != t.Self.Node {
		c, ok := t.Peers[owner]
		if !ok {
			return rdma.Choice{}, fmt.Errorf("%w: %s", ErrNodeDown, owner)
		}
		oc = c
	}
	self := t.Self
	return rdma.Select(&oc, &self, src, dst), nil
}

// Stop says goodbye to the peers, stops the node's actors (the whole
// ActorSystem when NewNode made it) and releases every resource of the
// node.
func (n *Node) Stop() error {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return nil
	}
	n.stopped = true
	n.mu.Unlock()
	n.cancel()
	if n.members != nil {
		_ = n.members.Close()
	}
	n.wg.Wait()
	if n.ownSystem {
		n.system.Shutdown()
	} else if pid := n.system.NewLocalPID(pingActor); pid != nil {
		_ = n.system.Root.StopFuture(pid).Wait()
	}
	n.eng.Close()
	return nil
}

func (n *Node) dialData(ctx context.Context, node, channel string) (net.Conn, error) {
	return n.members.DialData(ctx, node, channel)
}

// sweepLoop forgets pending requests whose futures completed or timed out.
func (n *Node) sweepLoop() {
	defer n.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.sweepFutures()
		}
	}
}
