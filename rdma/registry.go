package rdma

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tensorferry/tensorferry/memory"
)

// ErrUnknownChannel is returned for a channel name no backend registered.
var ErrUnknownChannel = errors.New("rdma: no channel backend registered under this name")

// Backend describes one kind of data channel to the rest of tensorferry:
// whether it can run here, what it advertises, which pairs of ends and
// devices it can serve, and how to make it. Each channel package registers
// its Backend in an init function (see Register); a node runs every
// registered backend that is viable and not disabled.
type Backend struct {
	// Name names the channel in Caps, configs, control requests and
	// descriptor offers: 1 to 32 characters from [a-z0-9_-].
	Name string
	// Priority orders the backends: Select picks the first, lowest Priority,
	// that both ends run and that can reach the pair (local 10, ipc 20,
	// verbs 30, staging 40); equal priorities are ordered by Name.
	Priority int
	// HolderBound is set for channels that serve an export only to the node
	// its lease was issued to (they hand out a per-peer IPC handle or RDMA
	// key); a forwarded descriptor cannot be fetched through them (see
	// Caps.ForHolder).
	HolderBound bool
	// Hardware is set when Viable depends on this machine's drivers or
	// devices, so that whether another host runs the channel cannot be told
	// from here (ferry topo assumes it absent there).
	Hardware bool
	// Viable returns nil when the channel can run on this machine, else the
	// reason, wrapping ErrNotViable. Nil means always viable.
	Viable func() error
	// Advertise, optional, adds what the channel advertises to this node's
	// Caps, in c.Ads[Name] (c.Ads is not nil). It runs only for a viable
	// channel that is not disabled.
	Advertise func(c *Caps)
	// AnySize is set for channels that move a device tensor of any size
	// faster than an inline copy through host memory (ipc: one device
	// copy, against a copy to the host, the bytes in the message and a
	// copy back). Below the inline threshold, a device tensor whose peer
	// such a channel reaches from the tensor's device to each of the
	// peer's GPUs is exported through it instead of copied inline (see
	// DirectSmall).
	AnySize bool
	// Scope, optional, returns nil when the pair of ends and devices is one
	// the channel is made for at all (same process, same host, device
	// memory), else why not. Select checks it before it checks that both
	// ends run the channel, so that its reason comes first.
	Scope func(owner, fetcher *Caps, src, dst memory.Device) error
	// Reach returns nil when the channel, run by both ends, can move a
	// tensor from owner's device src to fetcher's device dst, else the
	// reason (read from what both ends advertised). It must be a pure
	// function of its arguments.
	Reach func(owner, fetcher *Caps, src, dst memory.Device) error
	// New makes the channel of the node described by env. An error leaves
	// the channel out of the node's Caps with the error as the reason.
	New func(env *Env) (Channel, error)
}

var registry struct {
	mu     sync.RWMutex
	sorted []Backend // by Priority then Name; replaced, never modified
}

// Register adds b to the backends every node considers. It fails on an
// invalid or already registered name and on a nil Reach or New. Channel
// packages call it (through MustRegister) in an init function.
func Register(b Backend) error {
	if err := checkBackendName(b.Name); err != nil {
		return fmt.Errorf("rdma: Register: backend name %q: %w", b.Name, err)
	}
	if b.Reach == nil || b.New == nil {
		return fmt.Errorf("rdma: Register: backend %q needs Reach and New", b.Name)
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if slices.ContainsFunc(registry.sorted, func(o Backend) bool { return o.Name == b.Name }) {
		return fmt.Errorf("rdma: Register: backend %q registered twice", b.Name)
	}
	sorted := append(slices.Clone(registry.sorted), b)
	slices.SortFunc(sorted, func(x, y Backend) int {
		return cmp.Or(cmp.Compare(x.Priority, y.Priority), cmp.Compare(x.Name, y.Name))
	})
	registry.sorted = sorted
	return nil
}

// MustRegister is Register that panics on error, for init functions.
func MustRegister(b Backend) {
	if err := Register(b); err != nil {
		panic(err)
	}
}

// Backends returns the registered backends by Priority, then Name.
func Backends() []Backend { return slices.Clone(backends()) }

// LookupBackend returns the backend registered under name.
func LookupBackend(name string) (Backend, bool) {
	for _, b := range backends() {
		if b.Name == name {
			return b, true
		}
	}
	return Backend{}, false
}

// backends returns the shared sorted slice, which callers must not modify.
func backends() []Backend {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return registry.sorted
}

func checkBackendName(s string) error {
	if s == "" || len(s) > 32 {
		return errors.New("want 1 to 32 characters")
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("character %q outside [a-z0-9_-]", r)
		}
	}
	return nil
}
