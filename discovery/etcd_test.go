package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/etcdtest"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/memory"
)

// testTTL is the lease of the tests' nodes: etcd's shortest.
const testTTL = 2 * time.Second

// etcdConfig returns a validated config of cluster "test" registering in
// srv, with no nodes listed.
func etcdConfig(t testing.TB, srv *etcdtest.Server) *config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Cluster = "test"
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	cfg.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{
		Endpoints: []string{srv.ClientURL}, LeaseTTL: testTTL, DialTimeout: time.Second,
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// recorder collects a Discovery's events.
type recorder struct {
	ch   chan Event
	mu   sync.Mutex
	seen []Event
}

func newRecorder() *recorder { return &recorder{ch: make(chan Event, 1024)} }

func (r *recorder) fn(ev Event) {
	r.mu.Lock()
	r.seen = append(r.seen, ev)
	r.mu.Unlock()
	r.ch <- ev
}

// next returns the next event, failing the test if none comes within
// poll.Deadline.
func (r *recorder) next(t testing.TB) Event {
	t.Helper()
	select {
	case ev := <-r.ch:
		return ev
	case <-time.After(poll.Deadline):
		t.Fatalf("no event in %v", poll.Deadline)
		return Event{}
	}
}

// expect reads the next event and checks it.
func (r *recorder) expect(t testing.TB, kind EventKind, name, reason string) Event {
	t.Helper()
	ev := r.next(t)
	if ev.Kind != kind || ev.Node.Name != name || ev.Reason != reason {
		t.Fatalf("event %v %q (%q), want %v %q (%q)", ev.Kind, ev.Node.Name, ev.Reason, kind, name, reason)
	}
	return ev
}

// quiet checks that no event is waiting.
func (r *recorder) quiet(t testing.TB) {
	t.Helper()
	select {
	case ev := <-r.ch:
		t.Fatalf("unexpected event %v %q (%q)", ev.Kind, ev.Node.Name, ev.Reason)
	default:
	}
}

// node is a started etcd Discovery with its recorder.
type node struct {
	d   *etcd
	rec *recorder
	cfg config.NodeConfig
}

// nodeConfig returns the public part of node i.
func nodeConfig(i int) config.NodeConfig {
	return config.NodeConfig{
		Name:    fmt.Sprintf("node%d", i),
		Address: fmt.Sprintf("127.0.0.1:%d", 7000+i),
		Devices: []memory.Device{memory.CPU, memory.CUDA(i % 8)},
	}
}

// newNode returns node i's Discovery, not started, closed at the end.
func newNode(t testing.TB, cfg *config.Config, log *zap.Logger) *node {
	t.Helper()
	d, err := NewEtcd(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{d: d.(*etcd), rec: newRecorder()}
	t.Cleanup(func() {
		if err := n.d.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

func (n *node) start(t testing.TB, i int) {
	t.Helper()
	n.cfg = nodeConfig(i)
	ctx, cancel := context.WithTimeout(context.Background(), poll.Deadline)
	defer cancel()
	if err := n.d.Start(ctx, n.cfg, n.rec.fn); err != nil {
		t.Fatal(err)
	}
}

func startNode(t testing.TB, cfg *config.Config, i int) *node {
	t.Helper()
	n := newNode(t, cfg, nil)
	n.start(t, i)
	return n
}

func TestEtcdJoinAndLeave(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	a := startNode(t, cfg, 0)
	a.rec.quiet(t)
	if got, want := a.d.String(), "etcd("+srv.ClientURL+")"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}

	t0 := time.Now()
	b := startNode(t, cfg, 1)
	ev := a.rec.expect(t, Joined, "node1", "")
	t.Logf("a join seen after %v (from Start's call)", time.Since(t0))
	want := nodeConfig(1)
	if err := config.CheckNode(&want); err != nil {
		t.Fatal(err)
	}
	if !sameNode(ev.Node, want) || ev.Node.DataAddress != "127.0.0.1:7101" {
		t.Errorf("joined %+v, want %+v", ev.Node, want)
	}
	// The node known at Start is delivered before Start returns.
	b.rec.expect(t, Joined, "node0", "")

	c := newNode(t, cfg, nil)
	c.d.c.page = 1 // its first range reads three pages
	c.start(t, 2)
	a.rec.expect(t, Joined, "node2", "")
	b.rec.expect(t, Joined, "node2", "")
	first := []string{c.rec.next(t).Node.Name, c.rec.next(t).Node.Name}
	if strings.Join(first, ",") != "node0,node1" {
		t.Errorf("node2 learnt %v at Start, want node0 and node1", first)
	}

	t0 = time.Now()
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	a.rec.expect(t, Left, "node1", ReasonLeft)
	t.Logf("a leave seen after %v (from Close's call)", time.Since(t0))
	c.rec.expect(t, Left, "node1", ReasonLeft)
	if err := b.d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.d.Start(context.Background(), b.cfg, b.rec.fn); !errors.Is(err, ErrStarted) {
		t.Errorf("Start after Close: %v, want ErrStarted", err)
	}
	a.rec.quiet(t)
	b.rec.quiet(t)
}

func TestEtcdLeaseExpiry(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	a := startNode(t, cfg, 0)
	b := startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "")
	b.rec.expect(t, Joined, "node0", "")

	// node1 stops its keepalives, as if it had died: etcd expires its
	// lease within a TTL of the last keepalive.
	t0 := time.Now()
	b.d.keepalivePaused.Store(true)
	a.rec.expect(t, Left, "node1", ReasonLeaseExpired)
	t.Logf("an expired lease seen after %v (keepalives stopped; ttl %v, keepalive every %v)", time.Since(t0), testTTL, b.d.interval)

	// When it keeps alive again it finds its lease gone and registers
	// again.
	b.d.keepalivePaused.Store(false)
	a.rec.expect(t, Joined, "node1", "")
	b.rec.quiet(t)
}

func TestEtcdRestartMissesNothing(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	a := newNode(t, cfg, nil)
	gate := make(chan struct{})
	a.d.resyncGate = gate
	a.start(t, 0)
	b := startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "")

	srv.Kill()
	srv.Restart()
	// While node0's watch waits at the gate, node2 joins and node1 leaves.
	c := startNode(t, cfg, 2)
	c.rec.expect(t, Joined, "node0", "")
	c.rec.expect(t, Joined, "node1", "")
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	c.rec.expect(t, Left, "node1", ReasonLeft)
	a.rec.quiet(t)
	close(gate)
	a.rec.expect(t, Joined, "node2", "")
	a.rec.expect(t, Left, "node1", ReasonLeft)
}

func TestEtcdCompactedHistory(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	a := newNode(t, cfg, nil)
	gate := make(chan struct{})
	a.d.resyncGate = gate
	a.start(t, 0)
	b := startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "")

	a.d.restartWatch() // the watch breaks; its reconnection waits at the gate
	c := startNode(t, cfg, 2)
	c.rec.expect(t, Joined, "node0", "")
	c.rec.expect(t, Joined, "node1", "")
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Compact(srv.Revision())
	close(gate)
	// The history is gone: node0 ranges again and reports the difference,
	// the nodes gone first.
	a.rec.expect(t, Left, "node1", ReasonMissed)
	a.rec.expect(t, Joined, "node2", "")
}

func TestEtcdWatchBatchTooLarge(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	core, logs := observer.New(zap.InfoLevel)
	a := newNode(t, cfg, zap.New(core))
	a.d.c.maxLine = 4 << 10
	a.start(t, 0)
	startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "")
	// A batch beyond what node0 reads from its watch: it reads the
	// registrations again instead, skips the large one, and goes on
	// watching from there.
	big := "/tensorferry/test/nodes/big"
	srv.Put(big, []byte(strings.Repeat("b", 8<<10)))
	startNode(t, cfg, 2)
	a.rec.expect(t, Joined, "node2", "")
	a.rec.quiet(t)
	if logs.FilterMessage("watch: reading the registrations again").Len() == 0 {
		t.Error("the watch did not read the registrations again")
	}
	if logs.FilterMessage("skipping an invalid registration").Len() == 0 {
		t.Error("the large registration was not logged")
	}
}

func TestEtcdHostileValues(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	dir := "/tensorferry/test/nodes/"
	hostile := map[string][]byte{
		dir + "junk":        []byte("not json"),
		dir + "liar":        encodeTest(t, "someone-else", "127.0.0.1:7100"),
		dir + "badaddr":     []byte(`{"name":"badaddr","address":"nohost","devices":["cpu"]}`),
		dir + "baddev":      []byte(`{"name":"baddev","address":"127.0.0.1:7300","devices":["tpu:0"]}`),
		dir + "0big":        []byte(`{"name":"0big","address":"127.0.0.1:7400","pad":"` + strings.Repeat("x", 1<<20) + `"}`),
		dir + "bad name!":   encodeTest(t, "bad name!", "127.0.0.1:7500"),
		dir + "trailing":    []byte(`{"name":"trailing","address":"127.0.0.1:7600"} {}`),
		dir + "nested/node": encodeTest(t, "node", "127.0.0.1:7700"),
		dir + "manydevs":    []byte(`{"name":"manydevs","address":"127.0.0.1:7800","devices":[` + strings.Repeat(`"cpu",`, 300) + `"cpu"]}`),
	}
	// Large values fill node0's first range beyond what one answer may
	// hold (lowered to 1 MiB here, 16 MiB in earnest): it reads smaller
	// pages.
	for i := range 12 {
		k := fmt.Sprintf("%shuge%02d", dir, i)
		hostile[k] = []byte(strings.Repeat("h", 200<<10))
		srv.Put(k, hostile[k])
	}
	// The first key's value alone is beyond that bound: it is skipped.
	srv.Put(dir+"0big", hostile[dir+"0big"])
	// Of the others, every second one before node0 starts (its first
	// range), the rest while it watches.
	var others []string
	for k := range hostile {
		if !strings.Contains(k, "huge") && !strings.Contains(k, "0big") {
			others = append(others, k)
		}
	}
	slices.Sort(others)
	for i, k := range others {
		if i%2 == 0 {
			srv.Put(k, hostile[k])
		}
	}
	core, logs := observer.New(zap.WarnLevel)
	a := newNode(t, cfg, zap.New(core))
	a.d.c.max = 1 << 20
	a.start(t, 0)
	for i, k := range others {
		if i%2 == 1 {
			srv.Put(k, hostile[k])
		}
	}
	startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "") // the one valid registration
	a.rec.quiet(t)
	poll.Until(t, "every hostile value logged", func() bool {
		return logs.FilterMessage("skipping an invalid registration").Len() >= len(hostile)
	})
	if n := logs.FilterMessage("skipping an invalid registration").Len(); n != len(hostile) {
		for _, e := range logs.FilterMessage("skipping an invalid registration").All() {
			t.Log(e.ContextMap()["key"], e.ContextMap()["error"])
		}
		t.Errorf("%d invalid registrations logged, want %d", n, len(hostile))
	}

	// A known node's registration replaced by one with other addresses is
	// a Left and a Joined; node1, alive, puts its own back: the same again.
	srv.Put(dir+"node1", encodeTest(t, "node1", "127.0.0.1:9001"))
	a.rec.expect(t, Left, "node1", ReasonChanged)
	if ev := a.rec.expect(t, Joined, "node1", ""); ev.Node.Address != "127.0.0.1:9001" {
		t.Errorf("node1 joined again at %s", ev.Node.Address)
	}
	a.rec.expect(t, Left, "node1", ReasonChanged)
	if ev := a.rec.expect(t, Joined, "node1", ""); ev.Node.Address != nodeConfig(1).Address {
		t.Errorf("node1 put back at %s", ev.Node.Address)
	}
}

// TestEtcdOwnRegistrationRestored: a live node whose key is deleted or
// overwritten puts its registration back; the others see it gone for a
// moment at most (deleted), or not at all (garbage: skipped, not a
// departure).
func TestEtcdOwnRegistrationRestored(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	key := "/tensorferry/test/nodes/node1"
	core, logs := observer.New(zap.WarnLevel)
	a := newNode(t, cfg, zap.New(core))
	a.start(t, 0)
	startNode(t, cfg, 1)
	a.rec.expect(t, Joined, "node1", "")
	srv.Delete(key)
	a.rec.expect(t, Left, "node1", ReasonLeaseExpired)
	a.rec.expect(t, Joined, "node1", "") // put back by node1
	srv.Put(key, []byte("garbage"))
	poll.Until(t, "the garbage skipped", func() bool {
		return logs.FilterMessage("skipping an invalid registration").Len() >= 1
	})
	a.rec.quiet(t)
	// A third node starting now finds node1 registered.
	c := startNode(t, cfg, 2)
	seen := map[string]bool{}
	for range 2 {
		if ev := c.rec.next(t); ev.Kind == Joined {
			seen[ev.Node.Name] = true
		}
	}
	if !seen["node1"] {
		t.Errorf("node1 not registered after its key was overwritten: %v", seen)
	}
}

// encodeTest returns a registration of name at addr.
func encodeTest(t testing.TB, name, addr string) []byte {
	t.Helper()
	b, err := encodeNode(config.NodeConfig{Name: name, Address: addr}, false)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEtcdNameTaken(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcdConfig(t, srv)
	a := startNode(t, cfg, 0)
	dup := newNode(t, cfg, nil)
	// A second live node0 waits for the first's registration to expire,
	// which never comes: Start gives up when its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := dup.d.Start(ctx, nodeConfig(0), dup.rec.fn)
	if err == nil {
		t.Fatal("a second node0 registered")
	}
	t.Logf("second node0: %v", err)
	b := startNode(t, cfg, 1)
	b.rec.expect(t, Joined, "node0", "")
	b.rec.quiet(t)
	a.rec.expect(t, Joined, "node1", "")
}

func TestEtcdSecondEndpoint(t *testing.T) {
	srv := etcdtest.Start(t)
	// A listener that never answers: requests to it time out.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, tc := range []struct{ name, first string }{
		{"refused", "http://" + etcdtest.FreeAddr(t)},
		{"silent", "http://" + silent.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := etcdConfig(t, srv)
			cfg.Cluster = tc.name
			cfg.Discovery.Etcd.DialTimeout = 200 * time.Millisecond
			// Every request fails on the first endpoint and goes on to
			// the second.
			cfg.Discovery.Etcd.Endpoints = []string{tc.first, srv.ClientURL}
			a := startNode(t, cfg, 0)
			startNode(t, cfg, 1)
			a.rec.expect(t, Joined, "node1", "")
		})
	}
}

func TestEtcdUnreachable(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Cluster = "test"
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	cfg.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{
		Endpoints: []string{"http://" + etcdtest.FreeAddr(t)}, DialTimeout: 200 * time.Millisecond,
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d, err := FromConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), nodeConfig(0), func(Event) {}); err == nil {
		t.Fatal("Start succeeded without etcd")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
