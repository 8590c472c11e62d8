package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

func TestUsageAndUnknownCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !strings.Contains(out.String(), "usage: ferry") {
		t.Fatalf("no args: code %d, out %q", code, out.String())
	}
	if code := run([]string{"frobnicate"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "unknown command") {
		t.Fatalf("unknown command: code %d, err %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"ping", "--config", "x.yaml"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "--from is required") {
		t.Fatalf("missing flag: code %d, err %q", code, errOut.String())
	}
}

func TestTopo(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"topo", "--config", "../../config/testdata/local3.yaml"}, &out, &errOut); code != 0 {
		t.Fatalf("code %d: %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"OWNER", "a/cuda:0", "staging", "ipc: needs GPU memory at both ends", "CONTROL", "both on this host", "MEMBERSHIP", "VERBS GRANTS"} {
		if !strings.Contains(s, want) {
			t.Errorf("topo output lacks %q:\n%s", want, s)
		}
	}
}

// writeCluster writes a 3-node loopback config and starts node0 in-process.
func writeCluster(t *testing.T) (string, *config.Config) {
	t.Helper()
	cfg, err := config.LocalConfig("ferry", 3)
	if err != nil {
		t.Fatal(err)
	}
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n, err := actor.NewNode(cfg, "node0", actor.WithLogger(zap.NewNop()))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop() })
	return path, cfg
}

func TestPingAndBench(t *testing.T) {
	path, _ := writeCluster(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"ping", "--config", path, "--from", "node1", "--to", "node0", "--count", "20"}, &out, &errOut); code != 0 {
		t.Fatalf("ping: code %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "20 round trips node1 -> node0") || !strings.Contains(out.String(), "p99") {
		t.Fatalf("ping output: %q", out.String())
	}
	out.Reset()
	if code := run([]string{"bench", "--config", path, "--from", "node2", "--to", "node0", "--size", "1MiB", "--count", "3", "--metrics-address", "127.0.0.1:0", "--pprof"}, &out, &errOut); code != 0 {
		t.Fatalf("bench: code %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "over staging") || !strings.Contains(out.String(), "metrics of node2: http://127.0.0.1:") {
		t.Fatalf("bench output: %q", out.String())
	}
}

func TestPingUnreachable(t *testing.T) {
	cfg, err := config.LocalConfig("ferry", 2)
	if err != nil {
		t.Fatal(err)
	}
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	// A node that refuses connections is reported after a short grace,
	// not after the whole --timeout.
	start := time.Now()
	code := run([]string{"ping", "--config", path, "--from", "node1", "--to", "node0", "--timeout", "1m"}, &out, &errOut)
	if code != 3 || !strings.Contains(errOut.String(), "node0 unreachable") || !strings.Contains(errOut.String(), "connection refused") {
		t.Fatalf("code %d, stderr %q", code, errOut.String())
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("connection refused reported after %v (timeout 1m)", d)
	}
}

func TestPingWrongSecret(t *testing.T) {
	path, _ := writeCluster(t)
	// Same cluster, another secret: node0 refuses the handshake.
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), config.SecretFileName), []byte(strings.Repeat("w", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run([]string{"ping", "--config", path, "--from", "node1", "--to", "node0", "--timeout", "1m"}, &out, &errOut)
	if code != 3 || !strings.Contains(errOut.String(), "unreachable") || !strings.Contains(strings.ToLower(errOut.String()), "auth") {
		t.Fatalf("code %d, stderr %q", code, errOut.String())
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("a refused handshake reported after %v (timeout 1m)", d)
	}
}
