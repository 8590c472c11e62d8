package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/tensorferry/tensorferry/config"
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

func TestEmbeddedJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"--dim", "40000", "--steps", "15", "--json"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var res struct {
		Converged bool
		Distance  float64
		Channels  map[string]struct{ Bytes int64 }
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	// Between the embedded nodes tensors go by staging in host memory, by
	// ipc between GPUs.
	if !res.Converged || res.Distance > 1e-2 || res.Channels["staging"].Bytes+res.Channels["ipc"].Bytes == 0 {
		t.Fatalf("%+v", res)
	}
}

func TestNotConvergedExitsNonZero(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"--dim", "2000", "--steps", "1"}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "not converged") {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--mode", "eventual"},
		{"--dim", "0"},
		{"--config", "x.yaml"},
		{"extra"},
	} {
		var out, errb bytes.Buffer
		if rc := run(args, &out, &errb); rc != 2 {
			t.Errorf("%q: exit %d, want 2", args, rc)
		}
	}
}

// Three nodes of a cluster described by a config file, each run as by
// `paramserver --config FILE --node NAME`.
func TestConfigMode(t *testing.T) {
	cc, err := config.LocalConfig("ps-files", 3)
	if err != nil {
		t.Fatal(err)
	}
	// LocalConfig declares a node down after 500ms of silence, which a
	// loaded machine (or the race detector) can exceed: use the defaults.
	def := config.DefaultConfig()
	cc.HeartbeatInterval, cc.FailureTimeout = def.HeartbeatInterval, def.FailureTimeout
	path, err := cc.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, 3)
	errs := make([]bytes.Buffer, 3)
	rcs := make([]int, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rcs[i] = run([]string{"--config", path, "--node", fmt.Sprintf("node%d", i), "--dim", "40000", "--steps", "15", "--timeout", "2m"}, &outs[i], &errs[i])
		}()
	}
	wg.Wait()
	for i := range 3 {
		if rcs[i] != 0 {
			t.Errorf("node%d: exit %d: %s", i, rcs[i], errs[i].String())
		}
	}
	// node1 runs worker 0, so it drives and reports.
	if !strings.Contains(outs[1].String(), "distance") || strings.Contains(outs[0].String(), "distance") {
		t.Errorf("node1 should report:\nnode0: %s\nnode1: %s", outs[0].String(), outs[1].String())
	}
}
