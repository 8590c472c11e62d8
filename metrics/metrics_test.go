package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// twoNodes starts a 2-node loopback cluster with node0 and node1 up, and
// moves one 1 MiB tensor from node0 to node1.
func twoNodes(t *testing.T) []*actor.Node {
	t.Helper()
	cfg, err := config.LocalConfig("metrics", 2)
	if err != nil {
		t.Fatal(err)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	if err := nodes[0].WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	if got, err := nodes[0].PingTensor(ctx, "node1", x); err != nil || got != 1<<20 {
		t.Fatalf("PingTensor: %d, %v", got, err)
	}
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatal(err)
	}
	return nodes
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// series returns the value of the series of family with the given labels
// (a subset), and how many series matched.
func series(fams map[string]*dto.MetricFamily, family string, labels map[string]string) (float64, int) {
	var v float64
	n := 0
	mf := fams[family]
	if mf == nil {
		return 0, 0
	}
next:
	for _, m := range mf.GetMetric() {
		for k, want := range labels {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == k {
					got = l.GetValue()
				}
			}
			if got != want {
				continue next
			}
		}
		n++
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		}
	}
	return v, n
}

func TestServeTwoNodes(t *testing.T) {
	nodes := twoNodes(t)
	for _, opts := range []Options{{}, {PeerLabels: true, Pprof: true}} {
		srv, err := Serve(context.Background(), "127.0.0.1:0", opts, nodes...)
		if err != nil {
			t.Fatal(err)
		}
		code, body := get(t, "http://"+srv.Addr()+"/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d %s", code, body)
		}
		var p expfmt.TextParser
		fams, err := p.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		in := map[string]string{"node": "node1", "channel": "staging", "direction": "in"}
		out := map[string]string{"node": "node0", "channel": "staging", "direction": "out"}
		if opts.PeerLabels {
			in["peer"] = "node0"
		}
		checks := []struct {
			family string
			labels map[string]string
			want   float64
		}{
			{"tensorferry_transfer_bytes_total", in, 1 << 20},
			{"tensorferry_transfers_total", in, 1},
			{"tensorferry_transfer_bytes_total", out, 1 << 20},
			{"tensorferry_transfer_duration_seconds", map[string]string{"node": "node1", "channel": "staging"}, 1},
			{"tensorferry_tensors_exported_total", map[string]string{"node": "node0"}, 1},
			{"tensorferry_leases_outstanding", map[string]string{"node": "node0"}, 0},
			{"tensorferry_lent_bytes", map[string]string{"node": "node0"}, 0},
			{"tensorferry_peers_up", map[string]string{"node": "node0"}, 1},
			// shm where the shared-memory transport runs, else tcp.
			{"tensorferry_connections", map[string]string{"node": "node0", "purpose": "control", "transport": nodes[0].PeerTransport("node1")}, 1},
			{"tensorferry_connections", map[string]string{"node": "node0", "purpose": "data", "transport": "tcp"}, 1}, // node1's staging connection
			{"tensorferry_node_down_total", map[string]string{"node": "node0"}, 0},
			{"tensorferry_receive_budget_in_use_bytes", map[string]string{"node": "node1"}, 0},
		}
		if opts.PeerLabels {
			checks = append(checks, struct {
				family string
				labels map[string]string
				want   float64
			}{"tensorferry_peer_up", map[string]string{"node": "node1", "peer": "node0"}, 1})
		}
		for _, c := range checks {
			v, n := series(fams, c.family, c.labels)
			if n == 0 || v != c.want {
				t.Errorf("%+v: %s%v = %v in %d series, want %v", opts, c.family, c.labels, v, n, c.want)
			}
		}
		if v, n := series(fams, "tensorferry_receive_budget_bytes", map[string]string{"node": "node1"}); n != 1 || v <= 0 {
			t.Errorf("receive budget %v (%d series)", v, n)
		}
		if _, n := series(fams, "tensorferry_peer_up", nil); (n > 0) != opts.PeerLabels {
			t.Errorf("%+v: %d peer_up series", opts, n)
		}
		if _, n := series(fams, "go_goroutines", nil); n != 1 {
			t.Errorf("no Go runtime metrics")
		}
		code, _ = get(t, "http://"+srv.Addr()+"/debug/pprof/")
		if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[opts.Pprof]; code != want {
			t.Errorf("%+v: /debug/pprof/: %d, want %d", opts, code, want)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := http.Get("http://" + srv.Addr() + "/metrics"); err == nil {
			t.Errorf("served after Close")
		}
	}
}

// Serve stops when its context is done.
func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := Serve(ctx, "127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Serve(context.Background(), "127.0.0.1:-1", Options{}); err == nil {
		t.Fatal("bad address accepted")
	}
}

// doc.go lists every family.
func TestDocListsEveryFamily(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range FamilyNames() {
		if !strings.Contains(string(doc), name+" ") {
			t.Errorf("doc.go does not list %s", name)
		}
	}
}

// The listener holds at most MaxConns connections; an idle keep-alive
// connection is closed after IdleTimeout.
func TestServeBoundsConnections(t *testing.T) {
	srv, err := Serve(context.Background(), "127.0.0.1:0", Options{MaxConns: 2, IdleTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// Two idle keep-alive connections: each is closed by the server.
	for range 2 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a bound, not the wait
		if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("idle keep-alive connection: read %d, %v; want it closed by the server", n, err)
		}
	}
	// Two connections that send nothing hold both slots; a third is not
	// served until one of them goes.
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	third, err := net.Dial("tcp", srv.Addr()) // the kernel's queue takes it
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	fmt.Fprintf(third, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	got := make(chan error, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(third), nil)
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	// Not served while both slots are held (a check that can only pass
	// late, never fail wrongly, on a slow machine).
	select {
	case err := <-got:
		t.Fatalf("a third connection served while MaxConns 2 were held (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Closing one frees its slot.
	held[0].Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	held[1].Close()
}
