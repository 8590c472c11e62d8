package shm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// DefaultDir is where regions are made when Config.Dir is empty.
const DefaultDir = "/dev/shm"

// DefaultTimeout bounds Upgrade when its context has no deadline.
const DefaultTimeout = 5 * time.Second

// Transport names, as cluster.Peer.Transport and `ferry topo` print them.
const (
	// TransportShm: the connection's bytes go through shared memory rings.
	TransportShm = "shm"
)

// ErrFallback is wrapped by the error Upgrade returns when the connection
// stays on its socket, which it leaves open and usable: the peer is on
// another host, either end has the transport off or cannot make or map the
// region. The error says why.
var ErrFallback = errors.New("shm: staying on the socket")

// Config configures the shared-memory transport of one node.
type Config struct {
	// Disable turns the transport off: this node neither offers nor accepts
	// it, and its control connections stay on their sockets.
	Disable bool
	// Dir is the directory where the acceptor makes a region's files (the
	// memory and four FIFOs, mode 0600, random names), which exist only
	// until the initiator has opened them. It should be a tmpfs that both
	// processes see (default DefaultDir, /dev/shm); processes that do not
	// see the same one fall back to the socket.
	Dir string
	// RingSize is the size of each of the two rings, in bytes (default
	// DefaultRingSize, 1 MiB; a power of two within MinRingSize and
	// MaxRingSize). The acceptor's value is used.
	RingSize int
	// Spin is the longest a Read or Write spins waiting for the peer before
	// it sleeps (a duration; 0: DefaultSpin, 50 µs, when Go runs with at
	// least 8 processors (GOMAXPROCS) and as many CPUs (internal/fastpath)
	// or with TENSORFERRY_FASTPATHS=on, none with fewer, where a spin
	// takes the CPU the peer needs; negative: never). The spin turns itself
	// off while it rarely ends a wait (an idle or slow peer, busy CPUs).
	// Cluster's membership sets it from transport.read_spin.
	Spin time.Duration
	// HostID names this host; the transport is tried only with a peer that
	// names the same (default: the kernel's boot id,
	// /proc/sys/kernel/random/boot_id). Tests give two nodes of one machine
	// different ones to play two hosts.
	HostID string
	// RegionBudget bounds the bytes of the regions that this node's
	// upgrades hold at once, in flight or established (default
	// DefaultRegionBudget, 256 MiB; a region is two rings and three
	// pages). An upgrade that would pass it stays on the socket, as does
	// one with a peer that has another in flight; Limits enforces both.
	RegionBudget int64
}

func (c *Config) regionBudget() int64 {
	if c.RegionBudget == 0 {
		return DefaultRegionBudget
	}
	return c.RegionBudget
}

func (c *Config) dir() string {
	if c.Dir == "" {
		return DefaultDir
	}
	return c.Dir
}

func (c *Config) ringSize() (uint32, error) {
	if c.RingSize == 0 {
		return DefaultRingSize, nil
	}
	if c.RingSize < 0 {
		return 0, fmt.Errorf("shm: ring size %d", c.RingSize)
	}
	if err := checkRingSize(uint64(c.RingSize)); err != nil {
		return 0, err
	}
	return uint32(c.RingSize), nil
}

// hostID returns the configured host id or the kernel's boot id.
func (c *Config) hostID() (string, error) {
	if c.HostID != "" {
		return c.HostID, nil
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("shm: host id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", errors.New("shm: host id: empty boot id")
	}
	return id, nil
}

// Usable returns why this node cannot offer or accept the transport (it is
// disabled, the ring size is wrong, Dir is missing or not writable, the host
// has no id, the platform is not Linux), or nil: then a handshake offers it
// and Upgrade tries it.
func (c Config) Usable() error {
	if c.Disable {
		return errors.New("shm: disabled")
	}
	if _, err := c.ringSize(); err != nil {
		return err
	}
	if c.RegionBudget < 0 {
		return fmt.Errorf("shm: negative region budget %d", c.RegionBudget)
	}
	if _, err := c.hostID(); err != nil {
		return err
	}
	return viable(c.dir())
}
