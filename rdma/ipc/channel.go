package ipc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"go.uber.org/zap"
)

var (
	_ rdma.Channel        = (*Channel)(nil)
	_ rdma.ControlHandler = (*Channel)(nil)
)

// errBusy is returned when a peer holds too many acquisitions at once.
var errBusy = errors.New("ipc: too many transfers in flight from this peer")

// processID tells fetchers in the owner's own process (which cannot open
// the process's own IPC handles) that they may address the allocation
// directly.
var processID = func() (b [processIDLen]byte) {
	randomBytes(b[:])
	return b
}()

// Config tunes a Channel: the ipc section of the node's config. Zero
// fields take the defaults of DefaultConfig.
type Config = config.IPCConfig

// DefaultConfig returns the defaults, explained in config.IPCConfig.
func DefaultConfig() Config { return config.DefaultIPCConfig() }

// Channel is the CUDA IPC data channel between processes of one host. It
// is safe for concurrent use.
type Channel struct {
	env *rdma.Env
	cfg Config
	log *zap.Logger

	// Owner side, under mu.
	mu         sync.Mutex
	closed     bool
	proven     map[string]bool
	challenges map[string]*challenge        // pending, one per peer
	handles    map[uint64]*exportedHandle   // by allocation id
	grants     map[string]map[uint64]bool   // peer -> allocations whose handle it got
	revoked    map[string][]uint64          // peer -> freed allocations to tell it
	acqs       map[string]map[uint64]func() // peer -> acquisition id -> done
	nAcqs      int
	pushing    bool // a goroutine sends the revoked lists (pushRevocations)
	stopHook   func()
	ownerStats ownerStats

	// Fetcher side, under fmu (never held together with mu).
	bg         sync.WaitGroup // ends and revocations sent in the background
	fmu        sync.Mutex
	fclosed    bool
	mappings   map[mapKey]*mapping
	lanes      map[memory.Device][]*lane // idle
	nLanes     int
	nextAcq    uint64
	nOpen      int               // mappings opened and not closed
	proofGen   map[string]uint64 // proofs made, per owner
	proofMu    sync.Mutex        // serializes proofs
	fetchStats fetchStats

	// Driver seams, replaced by tests that run without a GPU.
	exportIPC func(memory.Buffer) (memory.IPCHandle, int, error)
	copyFunc  func(ctx context.Context, dst, src memory.Buffer) error // nil: copy on a lane
}

type ownerStats struct {
	handleExports, directOffers, revokesSent uint64
}

type fetchStats struct {
	opens, reuses, closes, abandoned, direct, revokes uint64
}

// Stats are counters of a Channel, for tests and monitoring.
type Stats struct {
	// Fetcher side.
	Mappings       int    // IPC mappings open (cached or in use)
	Opens          uint64 // mappings opened (cuIpcOpenMemHandle, or direct in one process)
	Reuses         uint64 // fetches that found their mapping open
	Direct         uint64 // fetches that copied under a direct offer (no begin, no end)
	Revokes        uint64 // revoke requests received from owners
	Closes         uint64 // mappings closed
	Lanes          int    // streams held (idle or copying)
	AbandonedLanes uint64 // streams given up after a copy that would not finish
	// Owner side.
	Handles       int    // allocations with a cached IPC handle
	HandleExports uint64 // cuIpcGetMemHandle calls
	DirectOffers  uint64 // offers that let their holder copy without begin and end
	RevokesSent   uint64 // revoke requests sent to fetchers
	Acquisitions  int    // exports held for copies in flight
	ProvenPeers   int    // peers that proved they run on this host
}

// New returns the ipc channel of a node. It fails with an error wrapping
// rdma.ErrNotViable when this machine has no CUDA driver or device, or no
// shared memory directory for the same-host proof.
func New(env *rdma.Env) (*Channel, error) {
	if env == nil {
		return nil, errors.New("ipc: Env needs Node, Store and Control")
	}
	return NewWithConfig(env, env.IPC)
}

// NewWithConfig is New with a Config in place of env.IPC.
func NewWithConfig(env *rdma.Env, cfg Config) (*Channel, error) {
	cfg = cfg.WithDefaults()
	if err := viable(cfg); err != nil {
		return nil, err
	}
	sweepStaleChallenges(cfg.ShmDir, 10*cfg.ChallengeTTL, time.Now())
	return newChannel(env, cfg)
}

// newChannel builds the channel without looking for a driver (tests).
func newChannel(env *rdma.Env, cfg Config) (*Channel, error) {
	if env == nil || env.Store == nil || env.Control == nil || env.Node == "" {
		return nil, errors.New("ipc: Env needs Node, Store and Control")
	}
	c := &Channel{
		env:        env,
		cfg:        cfg.WithDefaults(),
		log:        env.Logger().Named("ipc"),
		proven:     map[string]bool{},
		challenges: map[string]*challenge{},
		handles:    map[uint64]*exportedHandle{},
		grants:     map[string]map[uint64]bool{},
		revoked:    map[string][]uint64{},
		acqs:       map[string]map[uint64]func(){},
		mappings:   map[mapKey]*mapping{},
		lanes:      map[memory.Device][]*lane{},
		proofGen:   map[string]uint64{},
		exportIPC:  memory.ExportIPC,
	}
	// Acquisition ids start at random, so that a restarted fetcher does not
	// reuse the ids its previous life held on an owner.
	var b [8]byte
	randomBytes(b[:])
	c.nextAcq = binary.LittleEndian.Uint64(b[:]) >> 1
	c.stopHook = memory.OnFree(c.allocationFreed)
	return c, nil
}

// Name returns rdma.IPC.
func (c *Channel) Name() string { return rdma.IPC }

// Stats returns the channel's counters.
func (c *Channel) Stats() Stats {
	var s Stats
	c.mu.Lock()
	s.Handles = len(c.handles)
	s.HandleExports = c.ownerStats.handleExports
	s.DirectOffers, s.RevokesSent = c.ownerStats.directOffers, c.ownerStats.revokesSent
	s.Acquisitions = c.nAcqs
	s.ProvenPeers = len(c.proven)
	c.mu.Unlock()
	c.fmu.Lock()
	s.Mappings = c.nOpen
	s.Opens, s.Reuses, s.Closes = c.fetchStats.opens, c.fetchStats.reuses, c.fetchStats.closes
	s.Direct, s.Revokes = c.fetchStats.direct, c.fetchStats.revokes
	s.Lanes = c.nLanes
	s.AbandonedLanes = c.fetchStats.abandoned
	c.fmu.Unlock()
	return s
}

// InFlight returns the number of exports this owner holds for copies in
// flight (acquired and not yet ended).
func (c *Channel) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nAcqs
}

// HandleControl answers the control requests of a peer's ipc channel:
// same-host challenges and proofs, and the begin and end of each copy; and
// an owner's revocations of the mappings this node opened from it.
// Every failure is an answer carrying an error code; it never fails the
// control connection.
func (c *Channel) HandleControl(ctx context.Context, peer string, b []byte) ([]byte, error) {
	var rep *reply
	req, err := decodeRequest(b)
	if err != nil {
		rep = errorReply(err)
	} else {
		switch req.Op {
		case opChallenge:
			rep = c.handleChallenge(peer)
		case opProve:
			rep = c.handleProve(peer, req)
		case opBegin:
			rep = c.handleBegin(peer, req)
		case opEnd:
			rep = c.handleEnd(peer, req)
		case opRevoke:
			rep = c.handleRevoke(peer, req)
		}
	}
	return encode(rep)
}

// PeerDown forgets everything about node: on the owner side its proof, its
// pending challenge and the exports it held for copies; on the fetcher side
// every mapping opened from it is closed (at once when idle, when its copy
// ends otherwise, and that copy fails with rdma.ErrPeerDown).
func (c *Channel) PeerDown(node string) {
	c.mu.Lock()
	delete(c.proven, node)
	var files []*challenge
	if ch := c.challenges[node]; ch != nil {
		files = append(files, ch)
		delete(c.challenges, node)
	}
	dones := c.takeAcquisitionsLocked(node)
	delete(c.grants, node)
	delete(c.revoked, node)
	c.mu.Unlock()
	for _, ch := range files {
		ch.remove()
	}
	for _, done := range dones {
		done()
	}
	_ = c.dropMappings(func(k mapKey) bool { return k.owner == node }, fmt.Errorf("%w: %s", rdma.ErrPeerDown, node))
}

// Close releases every resource: exports held for peers, challenge files,
// mappings, streams. Copies in flight fail with rdma.ErrClosed; their
// mappings and streams are released when they end.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var files []*challenge
	for _, ch := range c.challenges {
		files = append(files, ch)
	}
	c.challenges = map[string]*challenge{}
	var dones []func()
	for peer := range c.acqs {
		dones = append(dones, c.takeAcquisitionsLocked(peer)...)
	}
	c.handles = map[uint64]*exportedHandle{}
	c.grants = map[string]map[uint64]bool{}
	c.revoked = map[string][]uint64{}
	c.proven = map[string]bool{}
	stop := c.stopHook
	c.mu.Unlock()
	stop()
	for _, ch := range files {
		ch.remove()
	}
	for _, done := range dones {
		done()
	}

	c.fmu.Lock()
	c.fclosed = true
	var idle []*lane
	for dev, ls := range c.lanes {
		idle = append(idle, ls...)
		delete(c.lanes, dev)
	}
	c.nLanes -= len(idle)
	c.fmu.Unlock()
	err := c.dropMappings(func(mapKey) bool { return true }, rdma.ErrClosed)
	for _, l := range idle {
		err = errors.Join(err, l.close())
	}
	c.bg.Wait()
	return err
}
