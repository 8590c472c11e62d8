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
