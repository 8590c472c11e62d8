package main

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// payloadSize is the size of every request, response and one-way message.
const payloadSize = 64

// Pinger does one request/response round trip of payloadSize bytes each way.
type Pinger interface {
	RoundTrip() error
}

// Sender sends one-way messages of payloadSize bytes to a receiver that
// counts them.
type Sender interface {
	// Send sends one message and returns without waiting for it to arrive.
	Send() error
	// WaitReceived blocks until the receiver has counted total messages
	// since the path was opened, or fails after timeout.
	WaitReceived(total int, timeout time.Duration) error
}

// path is one way of carrying messages between two endpoints in this
// process. main measures every built-in path and every path in extraPaths.
type path struct {
	// name identifies the path in the report ("raw-tcp").
	name string
	// open starts both ends on loopback.
	open func() (*endpoints, error)
	// rttOnly: the path has no sender (no one-way figures).
	rttOnly bool
}

// endpoints are the two ends of an opened path, seen from the sending side.
type endpoints struct {
	pinger Pinger       // nil: the path reports no round-trip figures
	sender Sender       // nil: the path reports no one-way figures
	close  func() error // stops both ends and every goroutine they started
}

// extraPaths are measured after the built-in ones; other files of this
// program append to it from init functions.
var extraPaths []path

// result is one figure of the report.
type result struct {
	Bench  string  `json:"bench"`
	Path   string  `json:"path"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Unit   string  `json:"-"`
	N      int     `json:"n"`
	// Interleave: the round trips were timed in this many blocks
	// alternating with the other paths' (--interleave); 0: in one stretch.
	Interleave int `json:"interleave,omitempty"`
}

// warmup returns how many untimed operations precede n timed ones.
func warmup(n int) int { return max(100, n/10) }

// measureRTT times n calls of f after a warm-up and returns the p50, p99 and
// minimum round trip in microseconds.
func measureRTT(name string, f func() error, n int) ([]result, error) {
	if n < 1 {
		return nil, errors.New("rtt count must be positive")
	}
	if err := warmRTT(name, f, n); err != nil {
		return nil, err
	}
	d, err := timeRTT(name, f, n, make([]time.Duration, 0, n))
	if err != nil {
		return nil, err
	}
	return rttFigures(name, d), nil
}

// warmRTT makes the untimed round trips that precede n timed ones.
func warmRTT(name string, f func() error, n int) error {
	for range warmup(n) {
		if err := f(); err != nil {
			return fmt.Errorf("%s: warm-up round trip: %w", name, err)
		}
	}
	return nil
}

// timeRTT times n calls of f, appending each duration to d.
func timeRTT(name string, f func() error, n int, d []time.Duration) ([]time.Duration, error) {
	for range n {
		t0 := time.Now()
		if err := f(); err != nil {
			return d, fmt.Errorf("%s: round trip %d: %w", name, len(d), err)
		}
		d = append(d, time.Since(t0))
	}
	return d, nil
}

// rttFigures returns the p50, p99 and minimum of the round trips d (at
// least one), in microseconds; d is sorted.
func rttFigures(name string, d []time.Duration) []result {
	slices.Sort(d)
	n := len(d)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	fig := func(metric string, v time.Duration) result {
		return result{Bench: "remote", Path: name, Metric: metric, Value: us(v), Unit: "µs", N: n}
	}
	return []result{
		fig("rtt_p50_us", d[n/2]),
		fig("rtt_p99_us", d[min(n-1, n*99/100)]),
		fig("rtt_min_us", d[0]),
	}
}

// measureOneWay sends n messages through s after a warm-up and returns the
// rate at which they arrived: from the first send until the receiver has
// counted the last one.
func measureOneWay(name string, s Sender, n int, timeout time.Duration) ([]result, error) {
	if n < 1 {
		return nil, errors.New("one-way count must be positive")
	}
	w := warmup(n)
	for range w {
		if err := s.Send(); err != nil {
			return nil, fmt.Errorf("%s: warm-up send: %w", name, err)
		}
	}
	if err := s.WaitReceived(w, timeout); err != nil {
		return nil, fmt.Errorf("%s: warm-up: %w", name, err)
	}
	t0 := time.Now()
	for i := range n {
		if err := s.Send(); err != nil {
			return nil, fmt.Errorf("%s: send %d: %w", name, i, err)
		}
	}
	if err := s.WaitReceived(w+n, timeout); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	el := time.Since(t0)
	return []result{
		{Bench: "remote", Path: name, Metric: "oneway_msgs_per_s", Value: float64(n) / el.Seconds(), Unit: "msg/s", N: n},
	}, nil
}

// counter counts received messages and wakes a waiter once a total is
// reached. Receivers of every path share it.
//
// The padding keeps the receiver's writes off the cache lines of the fields
// around it in a path's struct, which the sender reads for every message
// (the client, the target, the message). Without it each count moved a line
// the sender was reading and the sender's next read moved it back: a CPU
// profile of one-way on a 16-core host put a fifth of the sender's time
// and a sixth of the receiving actor's in those two places, the benchmark's
// own code. Two lines each side, as the adjacent-line prefetcher pairs
// them.
type counter struct {
	_      [128]byte
	mu     sync.Mutex
	n      int
	target int
	done   chan struct{} // closed when n reaches target; nil without a waiter
	_      [128]byte
}

// add counts k more messages.
func (c *counter) add(k int) {
	c.mu.Lock()
	c.n += k
	if c.done != nil && c.n >= c.target {
		close(c.done)
		c.done = nil
	}
	c.mu.Unlock()
}

// wait blocks until total messages were counted, or fails after timeout.
func (c *counter) wait(total int, timeout time.Duration) error {
	c.mu.Lock()
	if c.n >= total {
		c.mu.Unlock()
		return nil
	}
	done := make(chan struct{})
	c.done, c.target = done, total
	c.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		c.mu.Lock()
		n := c.n
		c.done = nil
		c.mu.Unlock()
		return fmt.Errorf("received %d of %d messages after %v", n, total, timeout)
	}
}
