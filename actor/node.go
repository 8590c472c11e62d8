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
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// Errors returned by a Node.
var (
	// ErrNodeDown is reported when the node an actor lives on is not up.
	ErrNodeDown = cluster.ErrNodeDown
	// ErrStopped is returned after Stop.
	ErrStopped = errors.New("actor: node stopped")
)

// ChannelFactory makes one data channel for a node. A factory whose error
// wraps rdma.ErrNotViable leaves the channel out with that reason.
type ChannelFactory func(env *rdma.Env) (rdma.Channel, error)

// Option configures a Node.
type Option func(*options)

type options struct {
	log              *zap.Logger
	factories        map[string]ChannelFactory
	refTTL           time.Duration
	maxInFlight      int
	maxInFlightBytes int64
	system           []pa.ConfigOption
}

// WithLogger sets the node's logger (default: none).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithChannel adds or replaces the data channel made by f under name.
func WithChannel(name string, f ChannelFactory) Option {
	return func(o *options) { o.factories[name] = f }
}

// WithRefTTL sets how long a lease lent through a tensor.Ref lasts when it is
// neither fetched nor released (default 10 minutes).
func WithRefTTL(d time.Duration) Option { return func(o *options) { o.refTTL = d } }

// WithSystemConfig passes options to the protoactor-go ActorSystem.
func WithSystemConfig(opts ...pa.ConfigOption) Option {
	return func(o *options) { o.system = append(o.system, opts...) }
}

// Node is one member of a tensorferry cluster: a protoactor-go ActorSystem
// whose remote PIDs (PIDs whose Address is another node's name) work with
// protoactor's own API, over tensorferry's wire protocol, and whose messages
// may carry tensors.
type Node struct {
	cfg         *cluster.Config
	self        cluster.NodeConfig
	incarnation uint64
	log         *zap.Logger
	opts        options

	system   *pa.ActorSystem
	members  *cluster.Membership
	store    *tensor.Store
	channels map[string]rdma.Channel
	caps     rdma.Caps
	device   memory.Device // default device of receiving actors
	inline   inlineMailboxes
	replies  replies // Request calls waiting for their reply

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	peers    map[string]*peerState
	peerSnap atomic.Pointer[map[string]*peerState]    // copy of peers, see peer
	remotes  map[string]*remoteProcess                // other node → its process; fixed at NewNode
	watching map[string]map[string]map[string]*pa.PID // node → watchee id → watcher id → watcher
	devices  map[string]memory.Device                 // local actor id → device
	stopped  bool

	flowMu sync.Mutex
	flow   map[uint64]*inFlight // export id → its message's credit (flow.go)

	ctlSeq  atomic.Uint64
	ctlMu   sync.Mutex
	ctlWait map[uint64]ctlWaiter
	stats   Stats
}

// NewNode makes the node named name of the cluster described by cfg (which
// must be valid). Start brings it up.
func NewNode(cfg *cluster.Config, name string, opts ...Option) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	self, ok := cfg.Node(name)
	if !ok {
		return nil, fmt.Errorf("actor: %w: %q", cluster.ErrUnknownNode, name)
	}
	o := options{factories: defaultChannels(), refTTL: 10 * time.Minute, maxInFlight: DefaultMaxInFlight, maxInFlightBytes: DefaultMaxInFlightBytes}
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
		opts:        o,
		channels:    map[string]rdma.Channel{},
		peers:       map[string]*peerState{},
		watching:    map[string]map[string]map[string]*pa.PID{},
		devices:     map[string]memory.Device{},
		ctlWait:     map[uint64]ctlWaiter{},
		flow:        map[uint64]*inFlight{},
		device:      memory.CPU,
	}
	if len(self.Devices) > 0 {
		n.device = self.Devices[0]
	}
	n.remotes = map[string]*remoteProcess{}
	for _, nc := range cfg.Nodes {
		if nc.Name != name {
			n.remotes[nc.Name] = &remoteProcess{n: n, node: nc.Name}
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.store = tensor.NewStore(name, n.incarnation)
	n.store.OnEnd(n.exportEnded)
	n.system = pa.NewActorSystem(append([]pa.ConfigOption{systemLogger(n.log)}, o.system...)...)
	n.system.ProcessRegistry.Address = name
	n.system.ProcessRegistry.RegisterAddressResolver(n.resolve)
	return n, nil
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
	env := &rdma.Env{
		Node:           n.self.Name,
		Incarnation:    n.incarnation,
		Store:          n.store,
		Log:            n.log,
		Dial:           n.dialData,
		Control:        n.control,
		ChunkSize:      n.cfg.ChunkSize,
		ChunksInFlight: n.cfg.ChunksInFlight,
	}
	n.caps = rdma.Caps{Node: n.self.Name, Incarnation: n.incarnation, HostID: hostID(), NotRunning: map[string]string{}}
	n.caps.Devices, n.caps.P2P = gpuCaps(n.self.Devices, n.log)
	for _, name := range rdma.Names {
		f, ok := n.opts.factories[name]
		switch {
		case n.cfg.ChannelDisabled(n.self.Name, name):
			n.caps.NotRunning[name] = "disabled in the config"
			continue
		case !ok:
			n.caps.NotRunning[name] = "not built into this node"
			continue
		}
		ch, err := f(env)
		if err != nil {
			n.caps.NotRunning[name] = err.Error()
			n.log.Info("channel not running", zap.String("channel", name), zap.Error(err))
			continue
		}
		n.channels[name] = ch
		n.caps.Channels = append(n.caps.Channels, name)
		if devs := rdmaDevices(name); devs != nil {
			n.caps.RDMA = devs
		}
	}
	body, err := wire.EncodeMsgpack(&n.caps)
	if err != nil {
		return err
	}
	m, err := cluster.NewMembership(n.cfg, n.self.Name, n.incarnation, (*handler)(n), cluster.Options{Logger: n.log, Caps: body})
	if err != nil {
		return err
	}
	n.members = m
	if err := m.Start(); err != nil {
		n.closeChannels()
		return err
	}
	if _, err := n.system.Root.SpawnNamed(pa.PropsFromFunc(pingReceive, n.WithInlineDelivery()), PingActor); err != nil {
		_ = m.Close()
		n.closeChannels()
		return fmt.Errorf("actor: spawning %s: %w", PingActor, err)
	}
	n.wg.Add(1)
	go n.sweepLoop()
	n.log.Info("node started", zap.String("address", n.self.Address), zap.Uint64("incarnation", n.incarnation),
		zap.Strings("channels", n.caps.Channels), zap.Stringer("device", n.device))
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

// Store returns the node's table of exported tensors.
func (n *Node) Store() *tensor.Store { return n.store }

// Caps returns what this node advertises to its peers.
func (n *Node) Caps() rdma.Caps { return n.caps }

// Device returns the default device of actors on this node.
func (n *Node) Device() memory.Device { return n.device }

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

// PeerCaps returns what the named peer advertised, if it is up.
func (n *Node) PeerCaps(node string) (rdma.Caps, bool) {
	ps := n.peer(node)
	if ps == nil {
		return rdma.Caps{}, false
	}
	return ps.caps, true
}

// Stop says goodbye to the peers, stops every actor and releases every
// resource of the node.
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
	n.system.Shutdown()
	n.closeChannels()
	n.store.Close()
	return nil
}

func (n *Node) closeChannels() {
	for _, ch := range n.channels {
		_ = ch.Close()
	}
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
