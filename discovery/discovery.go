package discovery

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/tensorferry/tensorferry/config"
)

// EventKind says what an Event reports.
type EventKind int

const (
	// Joined: a node is in the cluster (one known at Start, or one that
	// registered since).
	Joined EventKind = iota + 1
	// Left: a node is no longer in the cluster; Event.Reason says why.
	Left
)

// String returns "joined" or "left".
func (k EventKind) String() string {
	switch k {
	case Joined:
		return "joined"
	case Left:
		return "left"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Reasons of Left events.
const (
	// ReasonLeft: the node deregistered (its Discovery was closed).
	ReasonLeft = "left"
	// ReasonLeaseExpired: the node's registration went away without it
	// saying so: its lease expired (the node died or lost etcd for a
	// lease's TTL), or someone deleted its key.
	ReasonLeaseExpired = "lease expired"
	// ReasonMissed: the node's registration went away while this node
	// could not watch etcd, and the history that would tell how was
	// compacted.
	ReasonMissed = "deregistered while the watch was down"
	// ReasonChanged: the node registered again with other addresses or
	// devices; a Joined with the new ones follows.
	ReasonChanged = "registered again with other addresses"
)

// Event is a change of the cluster's membership.
type Event struct {
	Kind EventKind
	// Node is the node's public part: name, addresses and devices (for
	// Left, as last known).
	Node config.NodeConfig
	// Reason says why a node left (one of the Reason… constants); empty
	// for Joined.
	Reason string
}

// Discovery tells a node which nodes make up its cluster. Static reads the
// config's node list; NewEtcd registers in etcd and watches the others.
// Other sources (Kubernetes endpoints, a DNS name) implement the same
// interface.
type Discovery interface {
	// Start registers self (when the source registers) and delivers the
	// cluster's nodes to fn: first a Joined for every node known now,
	// delivered before Start returns, then changes as they happen. fn is
	// called in order and never concurrently (the later calls come from
	// one goroutine of the Discovery); it must not block for long. self
	// itself is never reported. ctx bounds Start only. Start may be called
	// once; the Discovery is closed after an error too.
	Start(ctx context.Context, self config.NodeConfig, fn func(Event)) error
	// Close deregisters (revokes the lease) and waits for the
	// Discovery's goroutines; fn is not called once it returns. It may be
	// called more than once, and without Start.
	Close() error
	// String names the source for logs and `ferry topo`: "static",
	// "etcd(http://10.0.0.9:2379)".
	String() string
}

// ErrStarted is returned by Start when called a second time or after
// Close.
var ErrStarted = errors.New("discovery: already started or closed")

// Static returns the Discovery that knows the config's node list and
// nothing else: Start reports a Joined for every node of cfg.Nodes but
// self, from Start itself, and no change ever.
func Static(cfg *config.Config) Discovery {
	return &static{nodes: append([]config.NodeConfig(nil), cfg.Nodes...)}
}

type static struct {
	mu    sync.Mutex
	used  bool
	nodes []config.NodeConfig
}

func (s *static) Start(_ context.Context, self config.NodeConfig, fn func(Event)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used {
		return ErrStarted
	}
	s.used = true
	for _, n := range s.nodes {
		if n.Name != self.Name {
			fn(Event{Kind: Joined, Node: public(n)})
		}
	}
	return nil
}

func (s *static) Close() error {
	s.mu.Lock()
	s.used = true
	s.mu.Unlock()
	return nil
}

func (s *static) String() string { return "static" }

// FromConfig returns the Discovery cfg.Discovery names: NewEtcd's when
// discovery.etcd is set, else Static. With etcd, the nodes cfg.Nodes lists
// are not reported from the file: like every node, they register. cfg
// must be validated.
func FromConfig(cfg *config.Config, log *zap.Logger) (Discovery, error) {
	if cfg.Discovery != nil && cfg.Discovery.Etcd != nil {
		return NewEtcd(cfg, log)
	}
	return Static(cfg), nil
}
