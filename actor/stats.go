package actor

import (
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/transfer"
)

// stats counts what a node's actor layer did; Node.Stats returns a snapshot.
type stats struct {
	MessagesSent     atomic.Int64
	MessagesReceived atomic.Int64
	DeliveryFailures atomic.Int64
	// DeadLetters counts messages from peers to actors of this node that
	// do not exist.
	DeadLetters atomic.Int64
	// NodeDowns counts the NodeDown events this node published.
	NodeDowns atomic.Int64
	// MessagesBatched counts received messages that came in a batch frame
	// (the rest came alone in their frame); BatchFrames counts those
	// frames.
	MessagesBatched atomic.Int64
	BatchFrames     atomic.Int64
	// MessagesInline counts received messages whose handler ran by inline
	// delivery (Node.WithInlineDelivery) on the goroutine that delivered
	// them: the connection's reader, or the engine's goroutine that
	// fetched their tensors.
	MessagesInline atomic.Int64
	// InlineBackpressure counts the times a connection's reader (or the
	// engine's delivery) waited because an inline mailbox held 64 Ki
	// messages.
	InlineBackpressure atomic.Int64
}

// ChannelStats is what one data channel moved into this node.
type ChannelStats = transfer.ChannelStats

// StatsSnapshot is a copy of a node's counters.
type StatsSnapshot struct {
	MessagesSent     int64
	MessagesReceived int64
	DeliveryFailures int64
	// DeadLetters counts messages from peers to actors of this node that
	// do not exist.
	DeadLetters     int64
	TensorsExported int64
	// MessagesBatched counts received messages that came in a batch frame,
	// BatchFrames those frames (MessagesBatched/BatchFrames is the mean
	// batch); MessagesInline those whose handler ran by inline delivery
	// on the goroutine that delivered them (the connection's reader, or
	// the engine's goroutine that fetched their tensors).
	MessagesBatched int64
	BatchFrames     int64
	MessagesInline  int64
	// InlineBackpressure counts the times a connection's reader waited
	// for an inline mailbox (Node.WithInlineDelivery) that held 64 Ki
	// messages to run half of them.
	InlineBackpressure int64
	// Exports is the number of tensors this node has lent that are not
	// released yet; LentBytes their bytes.
	Exports   int
	LentBytes int64
	// InboxRefused counts messages refused because their sender's inbox
	// was full; BudgetInUse is what the node has allocated for tensors
	// being fetched, Budget its limit, BudgetWaiting the messages whose
	// fetches wait for room in it (or in their peer's share).
	InboxRefused int64
	// ReaderDeliveries counts messages with tensors fetched and delivered
	// on the connection's reader, without the engine's delivery loop
	// (transfer.Engine.Receive).
	ReaderDeliveries int64
	BudgetInUse      int64
	Budget           int64
	BudgetWaiting    int64
	// CreditWaits counts messages with tensors that waited for a peer's
	// credits (it had not fetched earlier tensors yet), CreditWait the
	// time they waited in all.
	CreditWaits int64
	CreditWait  time.Duration
	// RelayServed, RelayFetched, RelayFallbacks and RelayPushed count
	// fan-out by relay across nodes (transfer.StatsSnapshot's fields of
	// those names).
	RelayServed    int64
	RelayFetched   int64
	RelayFallbacks int64
	RelayPushed    int64
	// LendViolations counts owners that wrote a tensor while it was lent
	// (only with WithLendCheck).
	LendViolations uint64
	// Channels maps a channel name to what it fetched into this node;
	// Served to what it served from this node's exports (see
	// transfer.StatsSnapshot.Served); ByPeer maps an owner to what each
	// channel fetched from it.
	Channels map[string]ChannelStats
	Served   map[string]ChannelStats
	ByPeer   map[string]map[string]ChannelStats
	// FailedTransfers counts failed fetches by reason (transfer.Fail*).
	FailedTransfers map[string]int64
	// Peers maps the peers that are up to what this node holds for them.
	Peers map[string]transfer.PeerStats
	// PeersUp maps every other node of the cluster to whether it is up.
	PeersUp map[string]bool
	// NodeDowns counts the NodeDown events this node published.
	NodeDowns int64
	// Conns counts the node's open connections by purpose and transport.
	Conns map[cluster.ConnKey]int
	// RegCaches are the counters of the node's registration caches, by
	// name.
	RegCaches map[string]memory.RegStats
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() StatsSnapshot {
	s := &n.stats
	e := n.eng.Stats()
	out := StatsSnapshot{
		MessagesSent:       s.MessagesSent.Load(),
		MessagesReceived:   s.MessagesReceived.Load(),
		DeliveryFailures:   s.DeliveryFailures.Load(),
		DeadLetters:        s.DeadLetters.Load(),
		TensorsExported:    e.TensorsExported,
		MessagesBatched:    s.MessagesBatched.Load(),
		BatchFrames:        s.BatchFrames.Load(),
		MessagesInline:     s.MessagesInline.Load(),
		InlineBackpressure: s.InlineBackpressure.Load(),
		Exports:            e.Leases,
		LentBytes:          e.LentBytes,
		InboxRefused:       e.InboxRefused,
		ReaderDeliveries:   e.ReaderDeliveries,
		BudgetInUse:        e.BudgetInUse,
		Budget:             e.Budget,
		BudgetWaiting:      e.BudgetWaiting,
		CreditWaits:        e.CreditWaits,
		RelayServed:        e.RelayServed,
		RelayFetched:       e.RelayFetched,
		RelayFallbacks:     e.RelayFallbacks,
		RelayPushed:        e.RelayPushed,
		CreditWait:         e.CreditWait,
		LendViolations:     n.eng.Store().LendViolations(),
		Channels:           e.Channels,
		Served:             e.Served,
		ByPeer:             e.ByPeer,
		FailedTransfers:    e.Failures,
		Peers:              e.Peers,
		NodeDowns:          s.NodeDowns.Load(),
		RegCaches:          e.RegCaches,
		Conns:              map[cluster.ConnKey]int{},
	}
	out.PeersUp = make(map[string]bool, len(n.remotes))
	for name := range n.remotes {
		out.PeersUp[name] = n.peer(name) != nil
	}
	if n.members != nil {
		out.Conns = n.members.Conns()
	}
	return out
}
