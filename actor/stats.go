package actor

import (
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what a node did. Read it with Node.Stats.
type Stats struct {
	MessagesSent     atomic.Int64
	MessagesReceived atomic.Int64
	DeliveryFailures atomic.Int64
	TensorsExported  atomic.Int64
	// MessagesBatched counts received messages that came in a batch frame
	// (the rest came alone in their frame).
	MessagesBatched atomic.Int64
	// MessagesInline counts received messages whose handler ran on the
	// connection's reader (Node.WithInlineDelivery).
	MessagesInline atomic.Int64

	mu       sync.Mutex
	channels map[string]ChannelStats
}

// ChannelStats is what one data channel moved into this node.
type ChannelStats struct {
	Transfers int64
	Bytes     int64
	Time      time.Duration
}

func (s *Stats) addBytes(channel string, n int64, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.channels == nil {
		s.channels = map[string]ChannelStats{}
	}
	c := s.channels[channel]
	c.Transfers++
	c.Bytes += n
	c.Time += d
	s.channels[channel] = c
}

// StatsSnapshot is a copy of a node's counters.
type StatsSnapshot struct {
	MessagesSent     int64
	MessagesReceived int64
	DeliveryFailures int64
	TensorsExported  int64
	MessagesBatched  int64
	MessagesInline   int64
	// Channels maps a channel name to what it fetched into this node.
	Channels map[string]ChannelStats
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() StatsSnapshot {
	s := &n.stats
	out := StatsSnapshot{
		MessagesSent:     s.MessagesSent.Load(),
		MessagesReceived: s.MessagesReceived.Load(),
		DeliveryFailures: s.DeliveryFailures.Load(),
		TensorsExported:  s.TensorsExported.Load(),
		MessagesBatched:  s.MessagesBatched.Load(),
		MessagesInline:   s.MessagesInline.Load(),
		Channels:         map[string]ChannelStats{},
	}
	s.mu.Lock()
	for k, v := range s.channels {
		out.Channels[k] = v
	}
	s.mu.Unlock()
	return out
}
