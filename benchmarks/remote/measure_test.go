package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// fakeSender delivers every message at once to its counter.
type fakeSender struct {
	c    counter
	drop int // messages to lose, to test the timeout
}

func (f *fakeSender) Send() error {
	if f.drop > 0 {
		f.drop--
		return nil
	}
	f.c.add(1)
	return nil
}

func (f *fakeSender) WaitReceived(total int, timeout time.Duration) error {
	return f.c.wait(total, timeout)
}

func TestMeasureRTT(t *testing.T) {
	calls := 0
	rs, err := measureRTT("fake", func() error { calls++; time.Sleep(10 * time.Microsecond); return nil }, 200)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 200+warmup(200) {
		t.Errorf("%d calls, want %d", calls, 200+warmup(200))
	}
	if len(rs) != 3 || rs[0].Metric != "rtt_p50_us" || rs[1].Metric != "rtt_p99_us" || rs[2].Metric != "rtt_min_us" {
		t.Fatalf("results %+v", rs)
	}
	if !(rs[2].Value >= 10 && rs[2].Value <= rs[0].Value && rs[0].Value <= rs[1].Value) {
		t.Errorf("want 10 ≤ min ≤ p50 ≤ p99, got %+v", rs)
	}
	for _, r := range rs {
		if r.Bench != "remote" || r.Path != "fake" || r.N != 200 {
			t.Errorf("result %+v", r)
		}
	}
	boom := errors.New("boom")
	if _, err := measureRTT("fake", func() error { return boom }, 10); !errors.Is(err, boom) {
		t.Errorf("got %v, want boom", err)
	}
}

func TestMeasureOneWay(t *testing.T) {
	rs, err := measureOneWay("fake", &fakeSender{}, 1000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Metric != "oneway_msgs_per_s" || rs[0].Value <= 0 || rs[0].N != 1000 {
		t.Fatalf("results %+v", rs)
	}
	_, err = measureOneWay("fake", &fakeSender{drop: warmup(1000) + 1}, 1000, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "after 50ms") {
		t.Fatalf("lost messages: got %v, want a timeout", err)
	}
}

func TestCounterWakesWaiter(t *testing.T) {
	var c counter
	done := make(chan error)
	go func() { done <- c.wait(3, 5*time.Second) }()
	for range 3 {
		time.Sleep(time.Millisecond)
		c.add(1)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := c.wait(3, 0); err != nil {
		t.Fatalf("already reached: %v", err)
	}
}

// fakePinger records its round trips in a shared log.
type fakePinger struct {
	name string
	log  *[]string
	fail error
}

func (f *fakePinger) RoundTrip() error {
	*f.log = append(*f.log, f.name)
	return f.fail
}

// TestRunInterleaved: the paths' round trips alternate in blocks after
// every warm-up, each path gets its count, its figures say how many blocks,
// one-way figures come for paths with a sender, and every path is closed,
// also when one fails.
func TestRunInterleaved(t *testing.T) {
	var log []string
	closed := map[string]int{}
	fake := func(name string, sender Sender, fail error) path {
		return path{name: name, open: func() (*endpoints, error) {
			return &endpoints{pinger: &fakePinger{name: name, log: &log, fail: fail}, sender: sender,
				close: func() error { closed[name]++; return nil }}, nil
		}}
	}
	const n, rounds = 100, 4
	rs, err := runInterleaved([]path{fake("a", &fakeSender{}, nil), fake("b", nil, nil)}, n, 1000, rounds, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := warmup(n)
	if len(log) != 2*(w+n) {
		t.Fatalf("%d round trips, want %d", len(log), 2*(w+n))
	}
	timed := log[2*w:]
	for i, name := range timed {
		if want := []string{"a", "b"}[i/(n/rounds)%2]; name != want {
			t.Fatalf("round trip %d of the timed ones went to %s, want %s (blocks of %d alternating)", i, name, want, n/rounds)
		}
	}
	var oneway int
	for _, r := range rs {
		switch r.Metric {
		case "oneway_msgs_per_s":
			oneway++
			if r.Path != "a" || r.Interleave != 0 {
				t.Errorf("one-way figure %+v", r)
			}
		default:
			if r.N != n || r.Interleave != rounds {
				t.Errorf("round-trip figure %+v", r)
			}
		}
	}
	if oneway != 1 || len(rs) != 7 {
		t.Fatalf("figures %+v", rs)
	}
	if closed["a"] != 1 || closed["b"] != 1 {
		t.Fatalf("closed %v", closed)
	}

	boom := errors.New("boom")
	if _, err := runInterleaved([]path{fake("a", nil, nil), fake("c", nil, boom)}, n, 1000, rounds, time.Second); !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	if closed["a"] != 2 || closed["c"] != 1 {
		t.Fatalf("after a failure, closed %v", closed)
	}
}
