package actor

import (
	"sync/atomic"

	"github.com/tensorferry/tensorferry/transfer"
)

// stats counts what a node's actor layer did; Node.Stats returns a snapshot.
type stats struct {
	MessagesSent     atomic.Int64
	MessagesReceived atomic.Int64
	DeliveryFailures atomic.Int64
	// MessagesBatched counts received messages that came in a batch frame
	// (the rest came alone in their frame).
	MessagesBatched atomic.Int64
	// MessagesInline counts received messages whose handler ran on the
	// connection's reader (Node.WithInlineDelivery).
	MessagesInline atomic.Int64
}

// ChannelStats is what one data channel moved into this node.
type ChannelStats = transfer.ChannelStats

// StatsSnapshot is a copy of a node's counters.
type StatsSnapshot struct {
	MessagesSent     int64
	MessagesReceived int64
	DeliveryFailures int64
	TensorsExported  int64
	MessagesBatched  int64
	MessagesInline   int64
	// Exports is the number of tensors this node has lent that are not
	// released yet.
	Exports int
	// InboxRefused counts messages refused because their sender's inbox
	// was full; BudgetInUse is what the node has allocated for tensors
	// being fetched, Budget its limit.
	InboxRefused int64
	BudgetInUse  int64
	Budget       int64
	// LendViolations counts owners that wrote a tensor while it was lent
	// (only with WithLendCheck).
	LendViolations uint64
	// Channels maps a channel name to what it fetched into this node.
	Channels map[string]ChannelStats
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() StatsSnapshot {
	s := &n.stats
	e := n.eng.Stats()
	return StatsSnapshot{
		MessagesSent:     s.MessagesSent.Load(),
		MessagesReceived: s.MessagesReceived.Load(),
		DeliveryFailures: s.DeliveryFailures.Load(),
		TensorsExported:  e.TensorsExported,
		MessagesBatched:  s.MessagesBatched.Load(),
		MessagesInline:   s.MessagesInline.Load(),
		Exports:          n.eng.Store().Len(),
		InboxRefused:     e.InboxRefused,
		BudgetInUse:      e.BudgetInUse,
		Budget:           e.Budget,
		LendViolations:   n.eng.Store().LendViolations(),
		Channels:         e.Channels,
	}
}
