package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor-go's dead-letter log throttle runs a timer goroutine
		// that outlives ActorSystem.Shutdown by up to its interval.
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		// signal.NotifyContext's watcher goroutine lives for the process.
		goleak.IgnoreAnyFunction("os/signal.signal_recv"),
		goleak.IgnoreAnyFunction("os/signal.loop"),
	)
}

func TestRun(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"--batches", "5", "--rows", "32", "--dim", "520", "--out", "8", "--inflight", "3", "--metrics-address", "127.0.0.1:0"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s\n%s", rc, errb.String(), out.String())
	}
	s := out.String()
	if strings.Count(s, "  OK") != 5 || !strings.Contains(s, "OK: every output equals") || !strings.Contains(s, "over staging") ||
		!strings.Contains(s, "metrics of the 3 nodes: http://127.0.0.1:") {
		t.Fatalf("output:\n%s", s)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--inflight", "0"}, {"--dim", "-1"}, {"--nope"}, {"extra"}} {
		var out, errb bytes.Buffer
		if rc := run(args, &out, &errb); rc != 2 {
			t.Errorf("%q: exit %d, want 2", args, rc)
		}
	}
}
