package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/metrics"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// screen collects what a program writes to a pseudo-terminal and lets a
// test wait for a pattern to appear.
type screen struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{} // closed and replaced at each write
	done    chan struct{} // closed when reading ends
}

func newScreen(ptmx *os.File) *screen {
	s := &screen{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			s.mu.Lock()
			s.buf.Write(b[:n])
			close(s.changed)
			s.changed = make(chan struct{})
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

const clear = "\x1b[H\x1b[2J"

// mark returns the index of the frame being drawn now.
func (s *screen) mark() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.buf.String(), clear)
}

// waitFor waits for a complete frame (each begins with a clear-screen)
// that matches every one of res, among those from the frame numbered from
// (see mark) on.
func (s *screen) waitFor(t *testing.T, from int, res ...*regexp.Regexp) string {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		out := s.buf.String()
		changed := s.changed
		s.mu.Unlock()
		frames := strings.Split(out, clear)
		for i := from; i < len(frames)-1; i++ { // the last may be incomplete
			if matchAll(frames[i], res) {
				return frames[i]
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no frame matches all of %v; the output ends with:\n%s", res, out[max(0, len(out)-3000):])
		}
	}
}

func matchAll(s string, res []*regexp.Regexp) bool {
	for _, re := range res {
		if !re.MatchString(s) {
			return false
		}
	}
	return true
}

// A 2-node cluster serves its metrics; `ferry top`, driven in a
// pseudo-terminal, shows the transfer between them and quits on q, and on
// Ctrl-C.
func TestTopInAPseudoTerminal(t *testing.T) {
	cfg, err := config.LocalConfig("top", 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var nodes []*actor.Node
	for _, nc := range cfg.Nodes {
		n, err := actor.NewNode(cfg, nc.Name, actor.WithLogger(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
		nodes = append(nodes, n)
	}
	var addrs []string
	for _, n := range nodes {
		srv, err := metrics.Serve(ctx, "127.0.0.1:0", metrics.Options{}, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		addrs = append(addrs, srv.Addr())
	}
	if err := nodes[0].WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	if got, err := nodes[0].PingTensor(ctx, "node1", x); err != nil || got != 1<<20 {
		t.Fatalf("PingTensor: %d bytes, %v", got, err)
	}
	// node0's metrics address comes from the config, node1's from --targets.
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	yml := fmt.Sprintf("cluster: top\nnodes:\n  - name: node0\n    address: %s\n    metrics_address: %s\n  - name: node1\n    address: %s\n",
		cfg.Nodes[0].Address, addrs[0], cfg.Nodes[1].Address)
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, key := range []struct {
		name string
		b    byte
	}{{"q", 'q'}, {"ctrl-c", 3}} {
		t.Run(key.name, func(t *testing.T) {
			ptmx, tty, err := pty.Open()
			if err != nil {
				t.Skipf("no pseudo-terminal: %v", err)
			}
			defer ptmx.Close()
			scr := newScreen(ptmx)
			done := make(chan error, 1)
			go func() {
				done <- top([]string{"--config", path, "--targets", addrs[1], "--interval", "50ms"}, tty, tty)
			}()
			quit := sync.OnceValue(func() error {
				if _, err := ptmx.Write([]byte{key.b}); err != nil {
					return err
				}
				select {
				case err := <-done:
					return err
				case <-ctx.Done():
					return fmt.Errorf("top did not quit: %w", ctx.Err())
				}
			})
			defer func() {
				_ = quit()
				tty.Close()
				ptmx.Close()
				<-scr.done
			}()
			// A frame with rates (not the first): node1 fetched the
			// megabyte, node0 served it; nothing moves now, so the rates
			// are 0 and the latencies those of all transfers (marked *).
			scr.waitFor(t, 0,
				regexp.MustCompile(`ferry top: 2 nodes`),
				regexp.MustCompile(`(?m)^node1 +staging +0 B/s +0 B/s +0\.0 +\S+\* +\S+\*`),
				regexp.MustCompile(`(?m)^node0 +staging +0 B/s +0 B/s +0\.0 +- +-`),
				regexp.MustCompile(`(?m)^node0 +1 +`), // one peer up
				regexp.MustCompile(`(?m)^node1 +1 +`))
			// Another megabyte moves: a frame shows it in node1's and
			// node0's rates, with the latency of this interval (no *).
			from := scr.mark()
			if got, err := nodes[0].PingTensor(ctx, "node1", x); err != nil || got != 1<<20 {
				t.Fatalf("PingTensor: %d bytes, %v", got, err)
			}
			scr.waitFor(t, from, regexp.MustCompile(`(?m)^node1 +staging +[0-9.]+ (KiB|MiB|GiB)/s +0 B/s +[1-9][0-9.]* +[0-9.]+(µs|ms|s) +[0-9.]+(µs|ms|s) *\r?$`))
			scr.waitFor(t, from, regexp.MustCompile(`(?m)^node0 +staging +0 B/s +[0-9.]+ (KiB|MiB|GiB)/s`))
			if err := quit(); err != nil {
				t.Fatalf("top: %v", err)
			}
		})
	}
}

func TestTopQuantile(t *testing.T) {
	bs := []bucket{{0.001, 10}, {0.01, 90}, {0.1, 100}, {math.Inf(1), 100}}
	for _, c := range []struct{ q, want float64 }{
		{0.05, 0.0005}, // within the first bucket: from 0
		{0.5, 0.001 + 0.009*40/80},
		{0.99, 0.01 + 0.09*9/10},
	} {
		if got := quantile(c.q, bs, 100); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	// Above the last finite bound: that bound.
	if got := quantile(0.99, []bucket{{0.1, 1}, {math.Inf(1), 10}}, 10); got != 0.1 {
		t.Errorf("quantile in +Inf = %v", got)
	}
	if got := quantile(0.5, nil, 0); !math.IsNaN(got) {
		t.Errorf("empty: %v", got)
	}
}

func TestTopFlags(t *testing.T) {
	noMetrics := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(noMetrics, []byte("cluster: x\nnodes:\n  - name: a\n    address: 127.0.0.1:7001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{},
		{"--targets", "127.0.0.1:1", "--interval", "0s"},
		{"--config", noMetrics},             // no metrics_address
		{"--config", noMetrics + ".absent"}, // unreadable
		{"--config", "top_test.go"},         // not YAML
	} {
		err := top(args, os.Stdin, os.Stdout)
		if ee, ok := err.(*exitError); !ok || ee.code != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// The config's metrics_address of each node, then --targets, each once.
func TestTopTargets(t *testing.T) {
	got, err := topTargets("../../config/testdata/local3.yaml", "10.0.0.1:9464, 127.0.0.1:9001,10.0.0.1:9464")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.1:9001", "10.0.0.1:9464"}; !slices.Equal(got, want) {
		t.Fatalf("targets %q, want %q", got, want)
	}
}
