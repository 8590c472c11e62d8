package config

import (
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/internal/fastpath"
)

// Limits of the transport and staging protocols: Validate refuses values
// beyond them, and the packages that speak the protocols use the same
// constants.
const (
	// DefaultMaxFrameSize is the default TransportConfig.MaxFrameSize, the
	// largest control frame payload in bytes (16 MiB): it holds any control
	// message with inline tensors and bounds what a bad peer can make a
	// node allocate.
	DefaultMaxFrameSize = 16 << 20
	// DefaultSendQueue is the default TransportConfig.SendQueue (4096
	// frames).
	DefaultSendQueue = 4096
	// MinMaxFrameSize and MaxMaxFrameSize bound TransportConfig.MaxFrameSize
	// (1 KiB and 1 GiB).
	MinMaxFrameSize = 1 << 10
	MaxMaxFrameSize = 1 << 30
	// DefaultChunkSize and DefaultChunksInFlight are the defaults of
	// StagingConfig.ChunkSize (4 MiB) and ChunksInFlight (4), also what a
	// staging request that names none gets.
	DefaultChunkSize      = 4 << 20
	DefaultChunksInFlight = 4
	// MaxChunkSize is the largest staging chunk either end accepts (64 MiB).
	MaxChunkSize = 64 << 20
	// MaxChunksInFlight is the largest staging window a request may ask for
	// (64 chunks).
	MaxChunksInFlight = 64
	// MaxStripes bounds StagingConfig.Stripes: a fetcher keeps at most this
	// many data connections to one owner.
	MaxStripes = 8
)

// TransportConfig tunes the control connections between nodes (YAML
// section transport). The zero value of a field means its default, as in
// DefaultTransportConfig.
type TransportConfig struct {
	// MaxFrameSize is the largest control frame payload sent or accepted,
	// in bytes; a larger frame kills its connection before anything is
	// allocated for it. MinMaxFrameSize..MaxMaxFrameSize; every node of a
	// cluster must use the same value. Default DefaultMaxFrameSize (16 MiB).
	// The frame header (wire.HeaderSize) is not counted.
	MaxFrameSize int
	// InlineThreshold is a size in bytes: tensors at or below it are copied
	// inline into control frames instead of moving out of band. Below
	// MaxFrameSize. Default 64 KiB: up to there, copying beats a rendezvous
	// round trip (the eager protocol of MPI).
	InlineThreshold int
	// InlineDevice keeps GPU tensors at or below InlineThreshold inline
	// for every peer (YAML: inline_device). Default false: such a tensor
	// goes to a peer of the same host device to device (ipc), which beats
	// two copies through host memory at every size.
	InlineDevice bool
	// SendQueue is the number of frames (a count) a control connection
	// queues for its writer before a Send blocks. Default 4096.
	SendQueue int
	// HandlerTakeover is how long (a duration) a frame's handler may run on
	// a control connection's reader before a new goroutine takes over
	// reading: the most a handler that blocks (an actor run inline) delays
	// the frames behind it. Default 10ms.
	HandlerTakeover time.Duration
	// MaxDataConnsPerPeer bounds (a count) the data connections one peer
	// may hold open on a node; one more is refused in the handshake with
	// the reason. Default 64: a staging fetcher keeps at most MaxStripes
	// per owner, which leaves room for several channels and redials.
	MaxDataConnsPerPeer int
	// MaxDataConns bounds (a count) the data connections of all peers
	// together. Default 1024: 16 peers at the per-peer bound, well below a
	// default descriptor limit.
	MaxDataConns int
	// DataIdleTimeout is how long (a duration) an authenticated data
	// connection may wait before naming its channel; it is closed then.
	// Default 0: the cluster's dial_timeout.
	DataIdleTimeout time.Duration
	// ReadSpin is how long (a duration, at most 1ms) the reader of a
	// control connection polls its socket, or its shared-memory ring, for
	// the next frame before it parks, and a Request spins on its reply
	// before it sleeps: a reply within it is taken without a thread
	// wake-up (10–30 µs on virtual machines), at the price of a processor
	// kept busy. Default 0: chosen by the machine, 50µs in a process with
	// 8 or more processors (GOMAXPROCS) and CPUs, or with
	// TENSORFERRY_FASTPATHS=on, and none below, where the spin would take
	// a processor the handlers need. ReadSpinOff (YAML: read_spin: off)
	// never spins.
	ReadSpin time.Duration
	// ReadSpinDetach (YAML: read_spin_detach) takes a TCP control
	// connection whose reader spins out of the Go runtime's network poller
	// on Linux (up to 128 per process), which spares the peer's writes the
	// poller's wake-ups; an idle one then holds a thread in poll(2).
	// Default SwitchAuto: on (wherever ReadSpin spins); SwitchOff spins
	// through the poller.
	ReadSpinDetach Switch
	// CallerReads (YAML: caller_reads) lets a goroutine waiting for its
	// reply (Node.Request) take the connection's read role and read the
	// reply itself instead of being woken by the reader goroutine
	// (wire.ConnOptions.CallerReads). Default SwitchAuto: on. An
	// interleaved A/B on a 16-core H200 host (benchmarks/results/
	// remote-ab-ctl2-1xH200-2026-11-28.txt) measured Request at 1.34x raw
	// TCP with it and 1.57-1.68x without; SwitchOff leaves all reading to
	// the reader goroutine.
	CallerReads Switch
	// BurstDecode (YAML: burst_decode) decodes the messages of a burst
	// (a batched frame) to an actor with inline delivery on the actor's
	// goroutine rather than the connection's reader. Default SwitchAuto:
	// on with 8 or more processors and CPUs, or TENSORFERRY_FASTPATHS=on;
	// off below, where the reader and the actor share the processors and
	// moving the decode costs more than it frees.
	BurstDecode Switch
	// InlineDelivery (YAML: inline_delivery) gives actors spawned with
	// actor.Node.WithInlineDelivery their inline mailbox, which may run a
	// message on the connection's reader. Default SwitchAuto: on;
	// SwitchOff gives them protoactor's default mailbox.
	InlineDelivery Switch
	// DirectWrite (YAML: direct_write) lets a send on a control
	// connection write on the sender's goroutine when nothing is queued
	// or being written, saving the hand-off to the writer goroutine
	// (wire.ConnOptions.DirectWrite). Default SwitchAuto: on; SwitchOff
	// queues every frame for the writer.
	DirectWrite Switch
	// IdleTimeout is how long (a duration) a control connection may carry
	// no frame before it is closed, with gossip membership (with the full
	// mesh, control connections stay open, carrying heartbeats): both ends
	// say goodbye so that nothing in flight is lost, and the next message
	// dials again. Default 30s; at least 10ms.
	IdleTimeout time.Duration
	// SharedMemory lets processes of one host exchange control frames
	// through shared-memory rings (package shm), where both ends can map them,
	// instead of loopback sockets (YAML: shared_memory). Default true;
	// false keeps every control connection of the node on its socket
	// (cluster.Options.SharedMemory holds the transport's finer knobs).
	SharedMemory bool
}

// ReadSpinOff is the TransportConfig.ReadSpin that never spins.
const ReadSpinOff time.Duration = -1

// MaxReadSpin is the longest TransportConfig.ReadSpin.
const MaxReadSpin = time.Millisecond

// DefaultTransportConfig returns the transport defaults described in
// TransportConfig.
func DefaultTransportConfig() TransportConfig {
	return TransportConfig{
		MaxFrameSize:        DefaultMaxFrameSize,
		InlineThreshold:     64 << 10,
		SendQueue:           DefaultSendQueue,
		HandlerTakeover:     10 * time.Millisecond,
		MaxDataConnsPerPeer: 64,
		MaxDataConns:        1024,
		IdleTimeout:         30 * time.Second,
		SharedMemory:        true,
	}
}

// WithDefaults returns t with its zero fields set to their defaults
// (booleans are kept as they are).
func (t TransportConfig) WithDefaults() TransportConfig {
	d := DefaultTransportConfig()
	orInt(&t.MaxFrameSize, d.MaxFrameSize)
	orInt(&t.InlineThreshold, d.InlineThreshold)
	orInt(&t.SendQueue, d.SendQueue)
	orDur(&t.HandlerTakeover, d.HandlerTakeover)
	orInt(&t.MaxDataConnsPerPeer, d.MaxDataConnsPerPeer)
	orInt(&t.MaxDataConns, d.MaxDataConns)
	orDur(&t.IdleTimeout, d.IdleTimeout)
	return t
}

func (t TransportConfig) validate(c *Config) error {
	const p = "transport."
	if err := c.checkInts([]intField{
		{p + "max_frame_size", int64(t.MaxFrameSize), MinMaxFrameSize, MaxMaxFrameSize, "bytes"},
		{p + "send_queue", int64(t.SendQueue), 1, 1 << 20, ""},
		{p + "max_data_conns_per_peer", int64(t.MaxDataConnsPerPeer), 1, 1 << 16, ""},
		{p + "max_data_conns", int64(t.MaxDataConns), 1, 1 << 20, ""},
	}); err != nil {
		return err
	}
	if t.ReadSpin > MaxReadSpin {
		return c.errf(p+"read_spin", "%v is above the maximum of %v", t.ReadSpin, MaxReadSpin)
	}
	for _, s := range []struct {
		field string
		s     Switch
	}{{"read_spin_detach", t.ReadSpinDetach}, {"caller_reads", t.CallerReads}, {"burst_decode", t.BurstDecode}, {"inline_delivery", t.InlineDelivery}, {"direct_write", t.DirectWrite}} {
		if !s.s.valid() {
			return c.errf(p+s.field, "%v is not auto, on or off", s.s)
		}
	}
	if err := fastpath.CheckEnv(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if t.InlineThreshold < 0 || t.InlineThreshold >= t.MaxFrameSize {
		return c.errf(p+"inline_threshold", "%d bytes must be below max_frame_size (%d)", t.InlineThreshold, t.MaxFrameSize)
	}
	return c.checkDurations([]durationField{
		{p + "handler_takeover", t.HandlerTakeover, time.Millisecond},
		{p + "data_idle_timeout", t.DataIdleTimeout, 0},
		{p + "idle_timeout", t.IdleTimeout, 10 * time.Millisecond},
	})
}

// FlowConfig bounds the tensors in flight between nodes: the sender's
// credits, the receiver's budgets and inboxes, and their deadlines (YAML
// section flow). The zero value of a field means its default, as in
// DefaultFlowConfig.
type FlowConfig struct {
	// TransferTimeout is the deadline (a duration) of one out-of-band tensor
	// transfer, from descriptor to delivered bytes, and the lease of every
	// tensor lent in a message; at least MinTransferTimeout. Default 60s:
	// many GiB move even over a slow staging path, yet a stuck transfer is
	// failed within a minute.
	TransferTimeout time.Duration
	// RefTTL is how long (a duration) a lease lent through a tensor.Ref
	// lasts when it is neither fetched nor released. Default 10m.
	RefTTL time.Duration
	// MaxInFlight bounds (a count), per peer, the messages with tensors to
	// fetch that a node has sent and the peer has not fetched yet; the
	// window the peer advertises lowers it. Default 64.
	MaxInFlight int
	// MaxInFlightBytes bounds the bytes of those tensors, per peer (a
	// larger message goes alone). Default 4 GiB.
	MaxInFlightBytes int64
	// ReceiveBudget is what a node allocates at once, in bytes, for
	// tensors being fetched, all peers together; at least
	// MinReceiveBudget (16 MiB) when set. Default 0: derived from the
	// node's memory, half of its smallest GPU's, or a quarter of the
	// host's for a node without GPUs (at least 256 MiB). Messages beyond
	// it wait in the sender's inbox until earlier ones are delivered.
	ReceiveBudget int64
	// ReceiveBudgetPerPeer is what one peer's messages may hold of
	// ReceiveBudget, in bytes; at most ReceiveBudget when that is set. A
	// message whose tensors exceed it is refused with a reason to its
	// sender. Default 0: half of ReceiveBudget.
	ReceiveBudgetPerPeer int64
	// ReceiveWindow is how many messages with tensors to fetch one peer
	// may have sent that this node has not fetched yet (a count). It is
	// advertised to the peer, whose sends wait for it; a peer that keeps
	// exceeding it is disconnected. Default 64.
	ReceiveWindow int
	// InboxMessages bounds the messages of one peer waiting for their
	// tensors or behind them (a count); beyond it they are refused with a
	// reason to their sender. Default 4096.
	InboxMessages int
	// InboxBytes bounds the encoded bytes those messages hold, per peer.
	// Default 256 MiB.
	InboxBytes int64
	// NoRelay turns fan-out by relay off (YAML: relay: false). With relay
	// on (the default), a node that fetches content it is already
	// fetching for another message (one tensor lent to several of its
	// actors) copies it from its first copy on the node instead of
	// fetching it from the owner again (package transfer, relay.go).
	NoRelay bool
	// RelayMinBytes is the smallest tensor, in bytes, that relay applies
	// to (YAML: relay_min_bytes). A tensor that may relay is fetched on a
	// goroutine of its own, not on the connection's reader, so that later
	// messages of the same content can join its fetch: a lone message of
	// that size pays for it (2xH200: 16 MiB one at a time 101 -> 201 us at
	// 4 MiB), while below 64 MiB fetching again costs little. Default
	// 64 MiB.
	RelayMinBytes int64
	// RelayFanout is how many receivers of one content a holder serves at
	// most on each kind of link (YAML: relay_fanout): when an owner lends
	// the same content to several nodes, it names in each descriptor the
	// receiver to fetch from first (transfer.PlanRelay: one fetch per host,
	// one per GPU, then copies from those), so that most bytes do not
	// leave the owner again. 1 makes chains. Default 4.
	RelayFanout int
	// NoRelayStream makes relayed copies wait until their holder's copy
	// is whole (YAML: relay_stream: false). With streaming on (the
	// default), a receiver borrows its holder's copy as soon as the
	// holder's fetch started and copies each piece once it landed there
	// (ipc: each ipc.copy_chunk), asking the holder how far it got, so
	// that the copies down a relay tree overlap instead of following one
	// another; an actor of the holder's own node copies each piece as it
	// lands too.
	NoRelayStream bool
	// NoRelayPush turns relay by push off (YAML: relay_push: false). With
	// it on (the default), a holder writes the copies of the receivers
	// that share its GPU: such a receiver lends its
	// destination to the holder the owner named, and the holder writes
	// each piece into it as its own copy fills, from its one CUDA
	// context, instead of each receiver copying from the holder in its
	// own context (the GPU then switches between the processes' contexts
	// at every piece). Needs relay_stream and a channel that writes
	// (ipc); otherwise, or when the push fails, the receiver fetches as
	// without it. 2xH200, 3 nodes of their own on one GPU, interleaved:
	// 256 MiB 1125-1155 us pushed vs 1371-1399 us streamed, 1 GiB
	// 3224-3236 vs 3500-3513 us; with 2 nodes pushing costs 1-7 %.
	NoRelayPush bool
}

// DefaultFlowConfig returns the flow defaults described in FlowConfig.
func DefaultFlowConfig() FlowConfig {
	return FlowConfig{
		TransferTimeout:  60 * time.Second,
		RefTTL:           10 * time.Minute,
		MaxInFlight:      64,
		MaxInFlightBytes: 4 << 30,
		ReceiveWindow:    64,
		InboxMessages:    4096,
		InboxBytes:       256 << 20,
		RelayMinBytes:    64 << 20,
		RelayFanout:      4,
	}
}

// WithDefaults returns f with its zero fields set to their defaults
// (ReceiveBudget and ReceiveBudgetPerPeer stay 0: derived by the node).
func (f FlowConfig) WithDefaults() FlowConfig {
	d := DefaultFlowConfig()
	orDur(&f.TransferTimeout, d.TransferTimeout)
	orDur(&f.RefTTL, d.RefTTL)
	orInt(&f.MaxInFlight, d.MaxInFlight)
	orInt(&f.MaxInFlightBytes, d.MaxInFlightBytes)
	orInt(&f.ReceiveWindow, d.ReceiveWindow)
	orInt(&f.InboxMessages, d.InboxMessages)
	orInt(&f.InboxBytes, d.InboxBytes)
	orInt(&f.RelayMinBytes, d.RelayMinBytes)
	orInt(&f.RelayFanout, d.RelayFanout)
	return f
}

// MinReceiveBudget is the smallest flow.receive_budget a config may set:
// a few staging chunks (a smaller one would refuse most tensor messages).
const MinReceiveBudget = 16 << 20

func (f FlowConfig) validate(c *Config) error {
	const p = "flow."
	if err := c.checkDurations([]durationField{
		{p + "transfer_timeout", f.TransferTimeout, MinTransferTimeout},
		{p + "ref_ttl", f.RefTTL, MinTransferTimeout},
	}); err != nil {
		return err
	}
	if err := c.checkInts([]intField{
		{p + "max_in_flight", int64(f.MaxInFlight), 1, 1 << 20, ""},
		{p + "max_in_flight_bytes", f.MaxInFlightBytes, 1, 1 << 50, "bytes"},
		{p + "receive_budget", f.ReceiveBudget, 0, 1 << 50, "bytes"},
		{p + "receive_budget_per_peer", f.ReceiveBudgetPerPeer, 0, 1 << 50, "bytes"},
		{p + "receive_window", int64(f.ReceiveWindow), 1, 1 << 20, ""},
		{p + "inbox_messages", int64(f.InboxMessages), 1, 1 << 24, ""},
		{p + "inbox_bytes", f.InboxBytes, 1, 1 << 40, "bytes"},
		{p + "relay_min_bytes", f.RelayMinBytes, 1, 1 << 50, "bytes"},
		{p + "relay_fanout", int64(f.RelayFanout), 1, 64, ""},
	}); err != nil {
		return err
	}
	if f.ReceiveBudget > 0 && f.ReceiveBudget < MinReceiveBudget {
		return c.errf(p+"receive_budget", "%s is below %s (0 derives it from the node's memory)",
			FormatSize(int(f.ReceiveBudget)), FormatSize(MinReceiveBudget))
	}
	if f.ReceiveBudget > 0 && f.ReceiveBudgetPerPeer > f.ReceiveBudget {
		return c.errf(p+"receive_budget_per_peer", "%s is above receive_budget (%s)",
			FormatSize(int(f.ReceiveBudgetPerPeer)), FormatSize(int(f.ReceiveBudget)))
	}
	return nil
}

// StagingConfig tunes the staging channel, the fallback that moves tensors
// through pinned host rings over a TCP data connection (YAML section
// staging). The zero value of a field means its default, as in
// DefaultStagingConfig.
type StagingConfig struct {
	// ChunkSize is the size in bytes of one staging chunk (one pinned host
	// buffer of the ring), at most MaxChunkSize. Default 4 MiB: the
	// D2H → socket → H2D pipeline stays busy while the ring stays small.
	ChunkSize int
	// ChunksInFlight is the number of chunks (a count) a transfer keeps
	// staged ahead, at most MaxChunksInFlight. Default 4: the three
	// pipeline stages overlap with one chunk to spare.
	ChunksInFlight int
	// MaxRingBytes bounds the pinned ring an owner allocates for one data
	// connection (chunk size × window), in bytes, whatever the fetcher
	// asks for; at least ChunkSize. Default 64 MiB.
	MaxRingBytes int
	// Stripes is how many ranges (a count, 1..MaxStripes) a large transfer
	// is split into, fetched at once over as many data connections: one TCP
	// stream is bound by the core that copies it. 1 turns striping off.
	// Default 0: 4 on a host with at least 8 CPUs for Go (GOMAXPROCS), 2
	// with at least 4, else 1 (see DefaultStripes).
	Stripes int
	// StripeMin is the smallest transfer, in bytes, that is striped; each
	// stripe has at least half of it. Default 16 MiB.
	StripeMin int64
	// IdleTimeout is how long (a duration) a fetcher keeps a data
	// connection to an owner, with the pinned ring the owner holds for
	// it, unused before closing it; the next transfer dials again.
	// Default 30s; at least 10ms.
	IdleTimeout time.Duration
}

// DefaultStagingConfig returns the staging defaults described in
// StagingConfig.
func DefaultStagingConfig() StagingConfig {
	return StagingConfig{
		ChunkSize:      DefaultChunkSize,
		ChunksInFlight: DefaultChunksInFlight,
		MaxRingBytes:   64 << 20,
		StripeMin:      16 << 20,
		IdleTimeout:    30 * time.Second,
	}
}

// WithDefaults returns s with its zero fields set to their defaults
// (Stripes stays 0: see DefaultStripes).
func (s StagingConfig) WithDefaults() StagingConfig {
	d := DefaultStagingConfig()
	orInt(&s.ChunkSize, d.ChunkSize)
	orInt(&s.ChunksInFlight, d.ChunksInFlight)
	orInt(&s.MaxRingBytes, d.MaxRingBytes)
	orInt(&s.StripeMin, d.StripeMin)
	orDur(&s.IdleTimeout, d.IdleTimeout)
	return s
}

func (s StagingConfig) validate(c *Config) error {
	const p = "staging."
	if err := c.checkInts([]intField{
		{p + "chunk_size", int64(s.ChunkSize), 1, MaxChunkSize, "bytes"},
		{p + "chunks_in_flight", int64(s.ChunksInFlight), 1, MaxChunksInFlight, ""},
		{p + "max_ring_bytes", int64(s.MaxRingBytes), 1, 1 << 30, "bytes"},
		{p + "stripes", int64(s.Stripes), 0, MaxStripes, ""},
		{p + "stripe_min", s.StripeMin, 2, 1 << 40, "bytes"},
	}); err != nil {
		return err
	}
	if s.MaxRingBytes < s.ChunkSize {
		return c.errf(p+"max_ring_bytes", "%s is below chunk_size (%s)", FormatSize(s.MaxRingBytes), FormatSize(s.ChunkSize))
	}
	return c.checkDurations([]durationField{{p + "idle_timeout", s.IdleTimeout, 10 * time.Millisecond}})
}

// IPCConfig tunes the ipc channel, which copies GPU memory between
// processes of one host through CUDA IPC handles (YAML section ipc). The
// zero value of a field means its default, as in DefaultIPCConfig.
type IPCConfig struct {
	// ShmDir is where owners write same-host challenge files; it must be
	// the host's shared memory directory, the same for every process of
	// the host. Default /dev/shm.
	ShmDir string
	// ChallengeTTL is how long (a duration) a challenge file waits for its
	// answer before it is deleted. Default 10s.
	ChallengeTTL time.Duration
	// CopyChunk is the bytes of one device copy; cancellation is noticed
	// between chunks. Default 64 MiB.
	CopyChunk int
	// CopyWindow is how many chunks (a count) are queued on the stream at
	// once, so that the copy engine never waits for the host. Default 4.
	CopyWindow int
	// CancelGrace is how long (a duration) a cancelled fetch waits for the
	// chunks already queued (the device reads the source and writes the
	// destination until they finish). Default 10s.
	CancelGrace time.Duration
	// MaxMappings is the number of opened IPC mappings (a count) kept after
	// use; beyond it idle mappings are closed, least recently used first.
	// Default 256.
	MaxMappings int
	// MaxAcquisitions bounds the transfers (a count) one peer may have in
	// flight on this owner. Default 1024.
	MaxAcquisitions int
	// IdleLanes is how many idle streams (with their events, a count) are
	// kept per device for later fetches. Default 8.
	IdleLanes int
	// DirectMargin: a holder copies under a direct offer (without begin
	// and end) only while at least this much (a duration) of the lease
	// remains; otherwise it begins, which keeps the export lent past the
	// lease's end until the copy is over. Default 1s.
	DirectMargin time.Duration
	// NoDirect makes this owner's offers never direct: every fetch costs
	// a begin and an end round trip (for comparison and tests). Default
	// false.
	NoDirect bool
}

// DefaultIPCConfig returns the ipc defaults described in IPCConfig.
func DefaultIPCConfig() IPCConfig {
	return IPCConfig{
		ShmDir:          "/dev/shm",
		ChallengeTTL:    10 * time.Second,
		CopyChunk:       64 << 20,
		CopyWindow:      4,
		CancelGrace:     10 * time.Second,
		MaxMappings:     256,
		MaxAcquisitions: 1024,
		IdleLanes:       8,
		DirectMargin:    time.Second,
	}
}

// WithDefaults returns i with its zero fields set to their defaults.
func (i IPCConfig) WithDefaults() IPCConfig {
	d := DefaultIPCConfig()
	if i.ShmDir == "" {
		i.ShmDir = d.ShmDir
	}
	orDur(&i.ChallengeTTL, d.ChallengeTTL)
	orInt(&i.CopyChunk, d.CopyChunk)
	orInt(&i.CopyWindow, d.CopyWindow)
	orDur(&i.CancelGrace, d.CancelGrace)
	orInt(&i.MaxMappings, d.MaxMappings)
	orInt(&i.MaxAcquisitions, d.MaxAcquisitions)
	orInt(&i.IdleLanes, d.IdleLanes)
	orDur(&i.DirectMargin, d.DirectMargin)
	return i
}

func (i IPCConfig) validate(c *Config) error {
	const p = "ipc."
	if err := c.checkDurations([]durationField{
		{p + "challenge_ttl", i.ChallengeTTL, time.Millisecond},
		{p + "cancel_grace", i.CancelGrace, time.Millisecond},
		{p + "direct_margin", i.DirectMargin, 0},
	}); err != nil {
		return err
	}
	return c.checkInts([]intField{
		{p + "copy_chunk", int64(i.CopyChunk), 4 << 10, 1 << 30, "bytes"},
		{p + "copy_window", int64(i.CopyWindow), 1, 1024, ""},
		{p + "max_mappings", int64(i.MaxMappings), 1, 1 << 20, ""},
		{p + "max_acquisitions", int64(i.MaxAcquisitions), 1, 1 << 20, ""},
		{p + "idle_lanes", int64(i.IdleLanes), 1, 1024, ""},
	})
}

// VerbsConfig tunes the verbs channel, one-sided RDMA READs over an
// InfiniBand or RoCE NIC (YAML section verbs). The zero value of a field
// means its default, as in DefaultVerbsConfig.
type VerbsConfig struct {
	// Device is the RDMA device to use. Default "": the first device with
	// a usable port.
	Device string
	// Port is the port number on Device. Default 0: the first usable one.
	Port uint8
	// ChunkSize is the bytes of one RDMA READ, at most 1 GiB. Default
	// 4 MiB.
	ChunkSize int
	// Window is how many READs (a count) one transfer keeps outstanding,
	// at most SendQueue. Default 4.
	Window int
	// SendQueue is the work requests (a count) one queue pair holds,
	// shared by the transfers from one owner. Default 256.
	SendQueue int
	// CacheBytes bounds the destination registrations the channel keeps
	// after their transfer (all owners together), in bytes. Least recently
	// used idle ones are deregistered first; ones in use never are.
	// Default 1 GiB.
	CacheBytes int64
	// CacheEntries bounds the same registrations in regions (a count).
	// Default 64.
	CacheEntries int
	// StallTimeout fails a connection whose reads make no progress for this
	// long (a duration): the owner died without the NIC noticing (soft
	// RoCE does not always time out) or the fabric is gone. The node's
	// PeerDown is the usual, faster path. Default 10s.
	StallTimeout time.Duration

	// The queue pair (RC) parameters; each one is 0..255, and 0 means its
	// default.
	//
	// AckTimeout is the local ACK timeout exponent, 4.096 µs × 2^AckTimeout,
	// at most 31. Default 14 (67 ms): with RetryCount 7 a dead peer fails a
	// transfer after about half a second.
	AckTimeout uint8
	// RetryCount is how many times a packet is resent before the queue pair
	// fails with a retry-exceeded completion, at most 7. Default 7.
	RetryCount uint8
	// RNRRetry is the receiver-not-ready retry count, at most 7 (7:
	// forever). Default 7.
	RNRRetry uint8
	// MaxRdAtomic is how many RDMA READs a queue pair may have outstanding
	// as an initiator; MaxDestRdAtomic how many it accepts as a responder.
	// The NIC may lower both. Default 16 each.
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	// MinRNRTimer is the RNR NAK timer code, at most 31. Default 12
	// (0.64 ms).
	MinRNRTimer uint8
	// HopLimit of the global route header (RoCE). Default 64.
	HopLimit uint8
	// TrafficClass of the global route header (RoCE: the DSCP and ECN bits
	// the fabric's QoS classifies by). Default 0.
	TrafficClass uint8
	// ServiceLevel of the path (InfiniBand QoS), at most 15. Default 0.
	ServiceLevel uint8
}

// DefaultVerbsConfig returns the verbs defaults described in VerbsConfig.
func DefaultVerbsConfig() VerbsConfig {
	return VerbsConfig{
		ChunkSize:    4 << 20,
		Window:       4,
		SendQueue:    256,
		CacheBytes:   1 << 30,
		CacheEntries: 64,
		StallTimeout: 10 * time.Second,

		AckTimeout:      14,
		RetryCount:      7,
		RNRRetry:        7,
		MaxRdAtomic:     16,
		MaxDestRdAtomic: 16,
		MinRNRTimer:     12,
		HopLimit:        64,
	}
}

// WithDefaults returns v with its zero fields set to their defaults.
func (v VerbsConfig) WithDefaults() VerbsConfig {
	d := DefaultVerbsConfig()
	orInt(&v.ChunkSize, d.ChunkSize)
	orInt(&v.Window, d.Window)
	orInt(&v.SendQueue, d.SendQueue)
	orInt(&v.CacheBytes, d.CacheBytes)
	orInt(&v.CacheEntries, d.CacheEntries)
	orDur(&v.StallTimeout, d.StallTimeout)
	orInt(&v.AckTimeout, d.AckTimeout)
	orInt(&v.RetryCount, d.RetryCount)
	orInt(&v.RNRRetry, d.RNRRetry)
	orInt(&v.MaxRdAtomic, d.MaxRdAtomic)
	orInt(&v.MaxDestRdAtomic, d.MaxDestRdAtomic)
	orInt(&v.MinRNRTimer, d.MinRNRTimer)
	orInt(&v.HopLimit, d.HopLimit)
	return v
}

func (v VerbsConfig) validate(c *Config) error {
	const p = "verbs."
	if err := c.checkInts([]intField{
		{p + "chunk_size", int64(v.ChunkSize), 1, 1 << 30, "bytes"},
		{p + "send_queue", int64(v.SendQueue), 1, 1 << 15, ""},
		{p + "window", int64(v.Window), 1, 1 << 15, ""},
		{p + "cache_bytes", v.CacheBytes, 1, 1 << 50, "bytes"},
		{p + "cache_entries", int64(v.CacheEntries), 1, 1 << 20, ""},
		{p + "ack_timeout", int64(v.AckTimeout), 0, 31, ""},
		{p + "retry_count", int64(v.RetryCount), 0, 7, ""},
		{p + "rnr_retry", int64(v.RNRRetry), 0, 7, ""},
		{p + "min_rnr_timer", int64(v.MinRNRTimer), 0, 31, ""},
		{p + "service_level", int64(v.ServiceLevel), 0, 15, ""},
	}); err != nil {
		return err
	}
	if v.Window > v.SendQueue {
		return c.errf(p+"window", "%d is above send_queue (%d)", v.Window, v.SendQueue)
	}
	return c.checkDurations([]durationField{{p + "stall_timeout", v.StallTimeout, time.Millisecond}})
}

// MemoryConfig tunes a node's allocators (YAML section memory). The zero
// value of a field means its default, as in DefaultMemoryConfig.
type MemoryConfig struct {
	// CUDACacheBytes bounds the cache of each CUDA device's caching
	// allocator: the bytes of freed blocks kept for reuse before blocks go
	// back to the driver (cuMemFree synchronizes the device). Default 0:
	// memory.DefaultCUDACacheBytes (1 GiB) or an eighth of the device's
	// memory when that is more.
	CUDACacheBytes int64
}

// DefaultMemoryConfig returns the memory defaults described in
// MemoryConfig.
func DefaultMemoryConfig() MemoryConfig { return MemoryConfig{} }

// WithDefaults returns m with its zero fields set to their defaults.
func (m MemoryConfig) WithDefaults() MemoryConfig { return m }

func (m MemoryConfig) validate(c *Config) error {
	return c.checkInts([]intField{{"memory.cuda_cache_bytes", m.CUDACacheBytes, 0, 1 << 50, "bytes"}})
}

// orInt sets *v to def when it is 0.
func orInt[T int | int64 | uint8](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// orDur sets *v to def when it is 0.
func orDur(v *time.Duration, def time.Duration) {
	if *v == 0 {
		*v = def
	}
}
