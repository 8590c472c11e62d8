package transfer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

func TestLatencyBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0},
		{10 * time.Microsecond, 0}, // bounds are inclusive (le)
		{11 * time.Microsecond, 1},
		{time.Millisecond, 6},
		{59 * time.Second, len(LatencyBounds) - 1},
		{2 * time.Minute, len(LatencyBounds)},
	} {
		if got := latencyBucket(c.d); got != c.want {
			t.Errorf("latencyBucket(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestFailureReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w", ErrPeerDown), FailPeerDown},
		{fmt.Errorf("fetch: %w", rdma.ErrPeerDown), FailPeerDown},
		{context.DeadlineExceeded, FailTimeout},
		{context.Canceled, FailCanceled},
		{fmt.Errorf("%w: old", tensor.ErrStale), FailStale},
		{ErrNoChannel, FailNoChannel},
		{ErrOverBudget, FailOverBudget},
		{rdma.ErrTooSmall, FailTooSmall},
		{fmt.Errorf("something else"), FailOther},
	} {
		if got := failureReason(c.err); got != c.want {
			t.Errorf("failureReason(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// What Engine.Stats reports sums the per-owner counters by channel.
func TestStatsSnapshot(t *testing.T) {
	e := New(Config{Node: "a", Incarnation: 1})
	defer e.Close()
	e.stats.addBytes("b", "staging", 100, 5*time.Microsecond)
	e.stats.addBytes("c", "staging", 200, 2*time.Millisecond)
	e.stats.addBytes("c", "local", 50, time.Hour)
	e.stats.addServed("staging", 300)
	e.stats.addFailure(fmt.Errorf("fetch: %w", ErrPeerDown))
	s := e.Stats()
	st := s.Channels["staging"]
	if st.Transfers != 2 || st.Bytes != 300 || st.Latency[0] != 1 || st.Latency[7] != 1 {
		t.Errorf("staging %+v", st)
	}
	if l := s.Channels["local"]; l.Transfers != 1 || sum(l.Latency[:]) != 0 {
		t.Errorf("local %+v: an hour is above every bucket", l)
	}
	if s.ByPeer["c"]["staging"].Bytes != 200 || s.ByPeer["b"]["staging"].Bytes != 100 {
		t.Errorf("by peer %+v", s.ByPeer)
	}
	if s.Served["staging"].Bytes != 300 || s.Failures[FailPeerDown] != 1 {
		t.Errorf("served %+v, failures %+v", s.Served, s.Failures)
	}
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

// The accounting of one fetch, on the path of every transfer: now (per
// owner and channel, with a latency bucket) and as it was before the
// metrics (per channel), in the same run.
func BenchmarkStatsAddBytes(b *testing.B) {
	b.Run("now", func(b *testing.B) {
		var s Stats
		for i := range b.N {
			s.addBytes("node1", "staging", 1<<20, time.Duration(i%1000)*time.Microsecond)
		}
	})
	b.Run("before", func(b *testing.B) {
		type channelStats struct { // ChannelStats before the metrics
			Transfers, Bytes int64
			Time             time.Duration
		}
		var mu sync.Mutex
		channels := map[string]channelStats{}
		for i := range b.N {
			mu.Lock()
			c := channels["staging"]
			c.Transfers++
			c.Bytes += 1 << 20
			c.Time += time.Duration(i%1000) * time.Microsecond
			channels["staging"] = c
			mu.Unlock()
		}
	})
}
