package transfer

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what an engine did.
type Stats struct {
	TensorsExported atomic.Int64
	// InboxRefused counts messages refused because the sender's inbox
	// was full (ErrInboxFull).
	InboxRefused atomic.Int64

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

// StatsSnapshot is a copy of an engine's counters and gauges.
type StatsSnapshot struct {
	TensorsExported int64
	InboxRefused    int64
	// BudgetInUse is what the node has allocated for tensors being
	// fetched; Budget its limit.
	BudgetInUse int64
	Budget      int64
	// Channels maps a channel name to what it fetched into this node.
	Channels map[string]ChannelStats
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() StatsSnapshot {
	s := &e.stats
	out := StatsSnapshot{
		TensorsExported: s.TensorsExported.Load(),
		InboxRefused:    s.InboxRefused.Load(),
		BudgetInUse:     e.budget.inUse(),
		Budget:          e.cfg.Flow.ReceiveBudget,
	}
	s.mu.Lock()
	out.Channels = maps.Clone(s.channels)
	s.mu.Unlock()
	if out.Channels == nil {
		out.Channels = map[string]ChannelStats{}
	}
	return out
}
