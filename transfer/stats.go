package transfer

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// LatencyBounds are the upper bounds, in seconds, of the latency buckets
// of ChannelStats: from 10 µs (a small local copy) to 60 s (the default
// transfer timeout).
var LatencyBounds = [...]float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
	1, 2.5, 5, 10, 30, 60,
}

// Stats counts what an engine did.
type Stats struct {
	TensorsExported atomic.Int64
	// InboxRefused counts messages refused because the sender's inbox
	// was full (ErrInboxFull).
	InboxRefused atomic.Int64
	// ReaderDeliveries counts messages fetched and delivered on the
	// connection's reader (Receive), without the delivery loop.
	ReaderDeliveries atomic.Int64
	// CreditWaits counts messages with tensors that waited in an outbox
	// for the peer's credits; CreditWaitNanos the time they waited.
	CreditWaits     atomic.Int64
	CreditWaitNanos atomic.Int64
	// controlWaits counts control requests whose peer's reader waited for
	// a slot (MaxControlPerPeer).
	controlWaits atomic.Int64
	// relayServed, relayFetched and relayFallbacks count fan-out by relay
	// across nodes (StatsSnapshot's fields of those names).
	relayServed, relayFetched, relayFallbacks atomic.Int64
	// relayPushed counts StatsSnapshot.RelayPushed.
	relayPushed atomic.Int64

	mu       sync.Mutex
	channels map[peerChannel]*ChannelStats // fetched into this node
	served   map[string]*ChannelStats      // served by this node as owner
	failures map[string]int64              // failed fetches by reason
}

// peerChannel keys what a channel fetched from one owner.
type peerChannel struct{ peer, channel string }

// ChannelStats is what one data channel moved: into this node (fetched) or
// out of it (served).
type ChannelStats struct {
	Transfers int64
	Bytes     int64
	Time      time.Duration
	// Latency counts the transfers by duration: Latency[i] those that
	// took more than LatencyBounds[i-1] seconds and at most
	// LatencyBounds[i]; Transfers minus their sum took longer than the
	// last bound. Served transfers have no latency.
	Latency [len(LatencyBounds)]int64
}

func (c *ChannelStats) add(o *ChannelStats) {
	c.Transfers += o.Transfers
	c.Bytes += o.Bytes
	c.Time += o.Time
	for i := range c.Latency {
		c.Latency[i] += o.Latency[i]
	}
}

// latencyBucket returns the index of d's bucket, len(LatencyBounds) for
// longer than the last bound.
func latencyBucket(d time.Duration) int {
	s := d.Seconds()
	i, _ := slices.BinarySearch(LatencyBounds[:], s)
	return i
}

func (s *Stats) addBytes(owner, channel string, n int64, d time.Duration) {
	b := latencyBucket(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.channels == nil {
		s.channels = map[peerChannel]*ChannelStats{}
	}
	k := peerChannel{owner, channel}
	c := s.channels[k]
	if c == nil {
		c = &ChannelStats{}
		s.channels[k] = c
	}
	c.Transfers++
	c.Bytes += n
	c.Time += d
	if b < len(c.Latency) {
		c.Latency[b]++
	}
}

// addServed counts bytes a channel served from this node's exports (the
// rdma.Env.Served hook).
func (s *Stats) addServed(channel string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served == nil {
		s.served = map[string]*ChannelStats{}
	}
	c := s.served[channel]
	if c == nil {
		c = &ChannelStats{}
		s.served[channel] = c
	}
	c.Transfers++
	c.Bytes += n
}

// Reasons a fetch failed, the keys of StatsSnapshot.Failures.
const (
	FailPeerDown   = "peer_down"
	FailTimeout    = "timeout"
	FailCanceled   = "canceled"
	FailStale      = "stale"
	FailNoChannel  = "no_channel"
	FailOverBudget = "over_budget"
	FailTooSmall   = "too_small"
	FailOther      = "error"
)

// failureReason classifies the error of a failed fetch.
func failureReason(err error) string {
	switch {
	case errors.Is(err, ErrPeerDown), errors.Is(err, rdma.ErrPeerDown):
		return FailPeerDown
	case errors.Is(err, context.DeadlineExceeded):
		return FailTimeout
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed), errors.Is(err, rdma.ErrClosed):
		return FailCanceled
	case errors.Is(err, tensor.ErrStale):
		return FailStale
	case errors.Is(err, ErrNoChannel):
		return FailNoChannel
	case errors.Is(err, ErrOverBudget):
		return FailOverBudget
	case errors.Is(err, rdma.ErrTooSmall):
		return FailTooSmall
	}
	return FailOther
}

// addFailure counts a failed fetch (or a message refused before its
// fetches: over budget).
func (s *Stats) addFailure(err error) {
	r := failureReason(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == nil {
		s.failures = map[string]int64{}
	}
	s.failures[r]++
}

// StatsSnapshot is a copy of an engine's counters and gauges.
type StatsSnapshot struct {
	TensorsExported int64
	InboxRefused    int64
	// ReaderDeliveries counts messages fetched and delivered on the
	// connection's reader (Receive).
	ReaderDeliveries int64
	// BudgetInUse is what the node has allocated for tensors being
	// fetched; Budget its limit. BudgetWaiting counts the messages whose
	// fetches wait for room in the node's or their peer's budget.
	BudgetInUse   int64
	Budget        int64
	BudgetWaiting int64
	// CreditWaits counts messages with tensors that waited in an outbox
	// for their peer's credits, CreditWait the time they waited in all.
	CreditWaits int64
	CreditWait  time.Duration
	// ControlWaits counts channel control requests whose peer's
	// connection waited because MaxControlPerPeer of its requests were
	// being handled.
	ControlWaits int64
	// RelayServed counts the copies this node lent to other receivers of
	// the same content (fan-out by relay, relay.go); RelayFetched the
	// fetches it made from such a receiver, as the owner's descriptor
	// asked; RelayFallbacks those it then made from the owner because
	// that receiver could not serve (not holding the content, down, or
	// its copy failed).
	RelayServed    int64
	RelayFetched   int64
	RelayFallbacks int64
	// RelayPushed counts, of RelayFetched, the copies that receiver
	// wrote into this node's destination itself (relay by push); their
	// bytes are counted under RelayPushChannel.
	RelayPushed int64
	// Channels maps a channel name to what it fetched into this node;
	// ByPeer maps an owner's name to the same per channel.
	Channels map[string]ChannelStats
	ByPeer   map[string]map[string]ChannelStats
	// Served maps a channel name to what it served from this node's
	// exports, for channels in which the owner takes part (staging: one
	// transfer per range request). One-sided channels (local, ipc, verbs)
	// count only on the fetcher.
	Served map[string]ChannelStats
	// Failures counts failed fetches by reason (the Fail* constants).
	Failures map[string]int64
	// Peers lists the peers that are up, with what their messages hold of
	// this node's budget and the credits this node holds for them.
	Peers map[string]PeerStats
	// Leases is the number of this node's exports not released yet,
	// LentBytes their bytes.
	Leases    int
	LentBytes int64
	// RegCaches are the counters of the channels' registration caches, by
	// cache name.
	RegCaches map[string]memory.RegStats
}

// PeerStats is what an engine holds for one peer.
type PeerStats struct {
	// BudgetInUse is what the peer's messages hold allocated here.
	BudgetInUse int64
	// CreditsInUse counts messages sent to the peer whose tensors it has
	// not fetched yet, CreditBytes their bytes.
	CreditsInUse int
	CreditBytes  int64
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() StatsSnapshot {
	s := &e.stats
	out := StatsSnapshot{
		TensorsExported:  s.TensorsExported.Load(),
		InboxRefused:     s.InboxRefused.Load(),
		ReaderDeliveries: s.ReaderDeliveries.Load(),
		BudgetInUse:      e.budget.inUse(),
		Budget:           e.cfg.Flow.ReceiveBudget,
		BudgetWaiting:    int64(e.budget.waiting()),
		CreditWaits:      s.CreditWaits.Load(),
		CreditWait:       time.Duration(s.CreditWaitNanos.Load()),
		ControlWaits:     s.controlWaits.Load(),
		RelayServed:      s.relayServed.Load(),
		RelayFetched:     s.relayFetched.Load(),
		RelayFallbacks:   s.relayFallbacks.Load(),
		RelayPushed:      s.relayPushed.Load(),
		Channels:         map[string]ChannelStats{},
		ByPeer:           map[string]map[string]ChannelStats{},
		Served:           map[string]ChannelStats{},
		Peers:            map[string]PeerStats{},
		RegCaches:        map[string]memory.RegStats{},
	}
	s.mu.Lock()
	for k, c := range s.channels {
		t := out.Channels[k.channel]
		t.add(c)
		out.Channels[k.channel] = t
		if out.ByPeer[k.peer] == nil {
			out.ByPeer[k.peer] = map[string]ChannelStats{}
		}
		out.ByPeer[k.peer][k.channel] = *c
	}
	for k, c := range s.served {
		out.Served[k] = *c
	}
	out.Failures = maps.Clone(s.failures)
	s.mu.Unlock()
	if out.Failures == nil {
		out.Failures = map[string]int64{}
	}
	if m := e.peerSnap.Load(); m != nil {
		for name, p := range *m {
			used, bytes := p.credits.inUse()
			out.Peers[name] = PeerStats{BudgetInUse: p.budget.inUse(), CreditsInUse: used, CreditBytes: bytes}
			out.BudgetWaiting += int64(p.budget.waiting())
		}
	}
	out.Leases, out.LentBytes = e.store.Lent()
	for _, ch := range e.channels {
		if h, ok := ch.(rdma.CacheHolder); ok {
			for _, c := range h.RegCaches() {
				st := c.Stats()
				sum := out.RegCaches[c.Name()]
				sum.Hits += st.Hits
				sum.Misses += st.Misses
				sum.Evictions += st.Evictions
				sum.Invalidations += st.Invalidations
				sum.RegisterErrors += st.RegisterErrors
				sum.UnregisterErrors += st.UnregisterErrors
				sum.Registered += st.Registered
				sum.Bytes += st.Bytes
				sum.InUse += st.InUse
				out.RegCaches[c.Name()] = sum
			}
		}
	}
	return out
}
