package gossip

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"github.com/tensorferry/tensorferry/config"
)

// Member is a node of the cluster as gossip knows it.
type Member struct {
	// Name is the node's name, unique in the cluster (config.CheckName).
	Name string
	// Incarnation is the node's incarnation as the node chose it (its
	// process start), not memberlist's: a restarted node has a higher one.
	Incarnation uint64
	// Address is the host:port of the node's control listener.
	Address string
	// DataAddress is the host:port of the node's data listener.
	DataAddress string
	// GossipAddress is the host:port (UDP and TCP) the node gossips on.
	GossipAddress string
}

// Events receives the changes of membership. Its methods are called from
// one goroutine of the Gossip, one call at a time, in the order of the
// changes of each node, never while memberlist holds a lock and never after
// Shutdown returns. They may call the Gossip's methods other than Shutdown;
// a call that blocks delays the next events (memberlist itself is never
// blocked by it: the changes wait, coalesced per node, in a queue that holds
// at most one entry per node).
//
// Events are about the other nodes, never about the Gossip's own node.
type Events interface {
	// Join reports a member that is alive: newly seen, back after a Leave,
	// or restarted (after the Leave of its earlier incarnation).
	Join(m Member)
	// Leave reports that member m is gone: declared dead after suspicion
	// ("dead: ..."), left gracefully ("left"), or replaced by a restart
	// ("restarted as incarnation N"). It follows a Join of the same m.
	Leave(m Member, reason string)
}

// Config configures a Gossip.
type Config struct {
	// Cluster is the cluster name (config.CheckName). Nodes of another
	// cluster never join: their traffic carries another memberlist label
	// and another key, both derived from Secret and Cluster (the label,
	// in clear text on the wire, does not name the cluster).
	Cluster string
	// Secret is the cluster secret, at least config.MinSecretLen bytes.
	// The gossip key is derived from it and Cluster with HKDF-SHA256
	// (salt "tensorferry gossip v1"); every packet and stream is encrypted
	// and authenticated with it (AES-256-GCM), and traffic without it is
	// refused.
	Secret []byte
	// Self is this node. Name, Incarnation, Address and DataAddress are
	// published to the others (in memberlist's node meta); GossipAddress
	// is the host:port to bind, UDP and TCP: a port of 0 takes one the
	// kernel picks (Self reports it), an empty host or 0.0.0.0 every
	// interface (the others then see a private IP of the host).
	Self Member
	// Gossip holds the timings; zero fields take the defaults of
	// config.DefaultGossipConfig (for a failure_timeout of 3s).
	Gossip config.GossipConfig
	// Logger receives this package's and memberlist's logs (memberlist's
	// network errors about peers at Warn). Default: none.
	Logger *zap.Logger
	// Transport, when set, wraps the network transport memberlist uses:
	// for tests and benchmarks that count packets or freeze a node (see
	// package gossiptest). Its Shutdown must shut the wrapped transport.
	Transport func(memberlist.Transport) memberlist.Transport
}

// Stats counts a Gossip's traffic since Start, measured at the network
// (after encryption and labels: what the wire carries, UDP and TCP
// payloads without their IP headers).
type Stats struct {
	// PacketsSent and PacketsReceived count UDP packets (probes, acks,
	// gossip); PacketBytesSent and PacketBytesReceived their bytes.
	PacketsSent, PacketsReceived         uint64
	PacketBytesSent, PacketBytesReceived uint64
	// StreamsDialed and StreamsAccepted count TCP streams (push-pulls,
	// joins, fallback pings); StreamBytesSent and StreamBytesReceived
	// their bytes.
	StreamsDialed, StreamsAccepted       uint64
	StreamBytesSent, StreamBytesReceived uint64
	// StreamsRefused counts accepted streams closed at once because the
	// most that may be open (32) were: a stream is authenticated only
	// once it has been read whole, so their number and length (1 MiB)
	// are bounded before.
	StreamsRefused uint64
	// PushPulls counts the full state exchanges this node took part in,
	// joins included.
	PushPulls uint64
	// Members is the number of alive members, this node included.
	Members int
}

// A Gossip is this node's membership in a cluster, on hashicorp/memberlist.
// Its methods are safe for concurrent use.
type Gossip struct {
	log    *zap.Logger
	logw   *zapWriter
	ml     *memberlist.Memberlist
	ct     *netTransport
	ev     Events
	self   Member
	meta   atomic.Pointer[[]byte] // this node's meta; replaced when it leaves
	events eventQueue

	// mu guards the delivered view: the members as Events saw them.
	mu      sync.Mutex
	members map[string]Member
	highest map[string]uint64 // the highest incarnation delivered per name
	leaving map[string]bool   // members that announced they are leaving
	badMeta map[string]string // the undecodable meta last logged per name

	pushPulls atomic.Uint64

	stop     chan struct{}
	done     chan struct{}
	shutOnce sync.Once
	shutErr  error
	down     atomic.Bool
}

// Start binds Self.GossipAddress and starts gossiping, alone until Join.
// It fails on a bad Config (every error names the field) or when the
// address cannot be bound.
func Start(cfg Config, ev Events) (*Gossip, error) {
	if ev == nil {
		return nil, errors.New("gossip: no Events")
	}
	if err := config.CheckName(cfg.Cluster); err != nil {
		return nil, fmt.Errorf("gossip: cluster: %w", err)
	}
	if len(cfg.Secret) < config.MinSecretLen {
		return nil, fmt.Errorf("gossip: secret is %d bytes, want at least %d", len(cfg.Secret), config.MinSecretLen)
	}
	self := cfg.Self
	if err := config.CheckName(self.Name); err != nil {
		return nil, fmt.Errorf("gossip: self name: %w", err)
	}
	if err := config.CheckAddress(self.Address); err != nil {
		return nil, fmt.Errorf("gossip: self address: %w", err)
	}
	if err := config.CheckAddress(self.DataAddress); err != nil {
		return nil, fmt.Errorf("gossip: self data address: %w", err)
	}
	ip, port, err := bindAddr(self.GossipAddress)
	if err != nil {
		return nil, err
	}
	g := cfg.Gossip.WithDefaults(0)
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	meta := appendMeta(nil, nodeMeta{Incarnation: self.Incarnation, Address: self.Address, DataAddress: self.DataAddress})
	// The meta must fit with the leaving flag set too (the same size).
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("gossip: addresses too long: node meta of %d bytes, more than %d", len(meta), memberlist.MetaMaxSize)
	}
	key, err := deriveKey(cfg.Secret, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("gossip: derive key: %w", err)
	}
	lbl, err := label(cfg.Secret, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("gossip: derive label: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.With(zap.String("node", self.Name))
	std, logw := newStdLogger(logger)

	ct, err := listen(ip, port, std)
	if err != nil {
		logw.stop()
		return nil, err
	}
	var tr memberlist.Transport = ct
	if cfg.Transport != nil {
		tr = cfg.Transport(ct)
	}

	gs := &Gossip{
		log:     logger,
		logw:    logw,
		ct:      ct,
		ev:      ev,
		self:    self,
		members: make(map[string]Member),
		highest: make(map[string]uint64),
		leaving: make(map[string]bool),
		badMeta: make(map[string]string),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	gs.meta.Store(&meta)
	gs.events.init(self.Name)

	mc := memberlist.DefaultLANConfig()
	mc.Name = self.Name
	mc.Transport = tr
	mc.BindAddr, mc.BindPort = ip.String(), ct.port
	mc.AdvertiseAddr, mc.AdvertisePort = "", ct.port
	mc.Label = lbl
	mc.SecretKey = key
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.ProbeInterval = g.ProbeInterval
	mc.ProbeTimeout = g.ProbeTimeout
	mc.SuspicionMult = g.SuspicionMult
	mc.SuspicionMaxTimeoutMult = g.SuspicionMaxTimeoutMult
	mc.GossipInterval = g.GossipInterval
	mc.GossipNodes = g.GossipNodes
	mc.PushPullInterval = g.PushPullInterval
	mc.GossipToTheDeadTime = g.PushPullInterval
	mc.RetransmitMult = g.RetransmitMult
	mc.TCPTimeout = g.TCPTimeout
	// Tiny packets: compression costs more than it saves.
	mc.EnableCompression = false
	// A restarted node may come back on another address (a port of 0):
	// let it take its name over as soon as the old one is dead. Which
	// incarnation wins is decided by ours, not by memberlist.
	mc.DeadNodeReclaimTime = time.Nanosecond
	mc.Delegate = (*delegate)(gs)
	mc.Events = (*eventDelegate)(gs)
	mc.Logger = std

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown()
		_ = ct.Shutdown()
		logw.stop()
		return nil, fmt.Errorf("gossip: start: %w", err)
	}
	gs.ml = ml
	gs.self.GossipAddress = ml.LocalNode().Address()
	go gs.deliver()
	return gs, nil
}

// bindAddr parses host:port for binding: a port in 0..65535, an IP or a
// name that resolves to one; an empty host binds every interface.
func bindAddr(s string) (net.IP, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return nil, 0, fmt.Errorf("gossip: gossip address %q: want host:port: %w", s, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return nil, 0, fmt.Errorf("gossip: gossip address %q: port must be a number in 0..65535", s)
	}
	if host == "" {
		return net.IPv4zero, port, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip, port, nil
	}
	a, err := net.ResolveIPAddr("ip", host)
	if err != nil {
		return nil, 0, fmt.Errorf("gossip: gossip address %q: %w", s, err)
	}
	return a.IP, port, nil
}

// JoinFanout is how many seeds Join exchanges state with at most: one
// answering seed gives the full state, a few more guard against a seed
// that is itself cut off; contacting every seed would cost every joining
// node a full-state exchange per seed (N² in a cluster that lists every
// node as a seed).
const JoinFanout = 3

// Join contacts the seeds (gossip addresses, host:port) in random order,
// exchanging the full state with each that answers until JoinFanout have;
// this node's own address is skipped. It returns how many answered, with
// an error only when none did (and there were seeds other than itself):
// unreachable seeds are tolerated. Joining is also how a node that was cut
// off comes back.
func (g *Gossip) Join(seeds []string) (int, error) {
	if g.down.Load() {
		return 0, errShutdown
	}
	others := make([]string, 0, len(seeds))
	for _, s := range seeds {
		if s != "" && s != g.self.GossipAddress && !slices.Contains(others, s) {
			others = append(others, s)
		}
	}
	if len(others) == 0 {
		return 0, nil
	}
	rand.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	var (
		joined int
		errs   []error
	)
	for _, s := range others {
		if joined == JoinFanout {
			break
		}
		n, err := g.ml.Join([]string{s})
		joined += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if joined == 0 {
		return 0, fmt.Errorf("gossip: join %s: %w", strings.Join(others, ", "), errors.Join(errs...))
	}
	return joined, nil
}

// errShutdown is returned by Join and Leave after Shutdown.
var errShutdown = errors.New("gossip: shut down")

// Members returns the alive members, this node included, sorted by name:
// the members as Events saw them (a member is in it from just before its
// Join to just before its Leave).
func (g *Gossip) Members() []Member {
	g.mu.Lock()
	out := make([]Member, 0, len(g.members)+1)
	out = append(out, g.self)
	for _, m := range g.members {
		out = append(out, m)
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Alive returns the member called name if it is alive (as Events saw it;
// this node always is).
func (g *Gossip) Alive(name string) (Member, bool) {
	if name == g.self.Name {
		return g.self, true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[name]
	return m, ok
}

// Self returns this node, with the gossip address it is bound to.
func (g *Gossip) Self() Member { return g.self }

// Leave tells the others that this node leaves, waiting up to timeout (0:
// no bound) for each of its two pieces of news to go out (that it is
// leaving, then that it left: a few gossip intervals each): they report
// Leave(self, "left") then, instead of a failure after detection. Call
// Shutdown after it; the node gossips no more news meanwhile.
func (g *Gossip) Leave(timeout time.Duration) error {
	if g.down.Load() {
		return errShutdown
	}
	// memberlist's own leave message does not reach the others' events
	// apart from a failure: the node first says it is leaving, in its meta.
	s := g.self
	meta := appendMeta(nil, nodeMeta{Incarnation: s.Incarnation, Address: s.Address, DataAddress: s.DataAddress, Leaving: true})
	g.meta.Store(&meta)
	if err := g.ml.UpdateNode(timeout); err != nil {
		return fmt.Errorf("gossip: leave: announce: %w", err)
	}
	if err := g.ml.Leave(timeout); err != nil {
		return fmt.Errorf("gossip: leave: %w", err)
	}
	return nil
}

// Shutdown stops gossiping at once, without telling the others (they
// detect it as failed; see Leave): it closes the listeners and every
// stream, waits for this package's goroutines and the transport's, and
// returns when Events will not be called again and nothing more is
// logged. memberlist gives no way to wait for its own loops: they exit as
// they next wake, a probe in flight within a probe interval (stretched up to
// 8 times when the node was falling behind). It is safe to call more than
// once.
func (g *Gossip) Shutdown() error {
	g.shutOnce.Do(func() {
		g.down.Store(true)
		g.shutErr = g.ml.Shutdown()
		if err := g.ct.Shutdown(); err != nil && g.shutErr == nil {
			g.shutErr = err
		}
		close(g.stop)
		<-g.done
		g.logw.stop()
	})
	return g.shutErr
}

// Stats returns the traffic counted since Start.
func (g *Gossip) Stats() Stats {
	g.mu.Lock()
	n := len(g.members) + 1
	g.mu.Unlock()
	t := g.ct
	return Stats{
		PacketsSent:         t.packetsSent.Load(),
		PacketsReceived:     t.packetsRecv.Load(),
		PacketBytesSent:     t.packetBytesSent.Load(),
		PacketBytesReceived: t.packetBytesRecv.Load(),
		StreamsDialed:       t.streamsDialed.Load(),
		StreamsAccepted:     t.streamsAcc.Load(),
		StreamBytesSent:     t.streamBytesSent.Load(),
		StreamBytesReceived: t.streamBytesRecv.Load(),
		StreamsRefused:      t.streamsRefused.Load(),
		PushPulls:           g.pushPulls.Load(),
		Members:             n,
	}
}

// delegate is the Gossip as memberlist's Delegate: it publishes the node
// meta and counts push-pulls; it carries no user data.
type delegate Gossip

func (d *delegate) NodeMeta(int) []byte             { return *d.meta.Load() } // its size was checked at Start
func (d *delegate) NotifyMsg([]byte)                {}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}
func (d *delegate) LocalState(bool) []byte {
	d.pushPulls.Add(1)
	return nil
}
