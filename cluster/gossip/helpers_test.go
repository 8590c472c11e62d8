package gossip

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/hashicorp/memberlist"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// testTimings are fast gossip timings for loopback tests.
var testTimings = config.GossipConfig{
	ProbeInterval:    50 * time.Millisecond,
	ProbeTimeout:     25 * time.Millisecond,
	GossipInterval:   20 * time.Millisecond,
	PushPullInterval: time.Second,
	TCPTimeout:       time.Second,
}

// detectBound is how long detecting a silent node may take in a cluster of
// n: two probe intervals to notice, the longest suspicion (without
// confirmations), a few gossip rounds to spread the news, all times four
// for a loaded test machine (memberlist stretches its probes when it
// falls behind).
func detectBound(g config.GossipConfig, n int) time.Duration {
	g = g.WithDefaults(0)
	susp := float64(g.SuspicionMult*g.SuspicionMaxTimeoutMult) * max(1, math.Log10(float64(n)))
	return 4 * (time.Duration((2+susp)*float64(g.ProbeInterval)) + 4*g.GossipInterval)
}

// event is one call of Events.
type event struct {
	join   bool
	m      Member
	reason string
}

func (e event) String() string {
	if e.join {
		return fmt.Sprintf("Join(%s#%d)", e.m.Name, e.m.Incarnation)
	}
	return fmt.Sprintf("Leave(%s#%d, %q)", e.m.Name, e.m.Incarnation, e.reason)
}

// recorder is an Events that records every call.
type recorder struct {
	mu     sync.Mutex
	events []event
	ch     chan event
}

func newRecorder() *recorder { return &recorder{ch: make(chan event, 4096)} }

func (r *recorder) Join(m Member) { r.add(event{join: true, m: m}) }
func (r *recorder) Leave(m Member, reason string) {
	r.add(event{m: m, reason: reason})
}

func (r *recorder) add(e event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	r.ch <- e
}

// all returns the events so far.
func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

// leaves returns the Leave events so far.
func (r *recorder) leaves() []event {
	var out []event
	for _, e := range r.all() {
		if !e.join {
			out = append(out, e)
		}
	}
	return out
}

// next waits for the next event matching ok, failing t after a deadline
// (only a test whose event never comes waits that long).
func (r *recorder) next(t testing.TB, what string, ok func(event) bool) event {
	t.Helper()
	deadline := time.NewTimer(poll.Deadline)
	defer deadline.Stop()
	for {
		select {
		case e := <-r.ch:
			if ok(e) {
				return e
			}
		case <-deadline.C:
			t.Fatalf("%s: not seen in %v; events: %v", what, poll.Deadline, r.all())
		}
	}
}

// node is a started Gossip with its recorder.
type node struct {
	*Gossip
	rec *recorder
}

// nodeOpt changes a node's Config before Start.
type nodeOpt func(*Config)

func withSecret(s string) nodeOpt               { return func(c *Config) { c.Secret = []byte(s) } }
func withCluster(s string) nodeOpt              { return func(c *Config) { c.Cluster = s } }
func withAddr(a string) nodeOpt                 { return func(c *Config) { c.Self.GossipAddress = a } }
func withTimings(g config.GossipConfig) nodeOpt { return func(c *Config) { c.Gossip = g } }
func withTransport(f func(memberlist.Transport) memberlist.Transport) nodeOpt {
	return func(c *Config) { c.Transport = f }
}

// start starts node name (incarnation inc) on 127.0.0.1, a free port; it is
// shut down at the end of the test.
func start(t testing.TB, name string, inc uint64, opts ...nodeOpt) *node {
	t.Helper()
	i := strings.TrimLeft(name, "abcdefghijklmnopqrstuvwxyz")
	cfg := Config{
		Cluster: "test",
		Secret:  []byte(testSecret),
		Self: Member{Name: name, Incarnation: inc, Address: "127.0.0.1:7" + i + "01", DataAddress: "127.0.0.1:7" + i + "02",
			GossipAddress: "127.0.0.1:0"},
		Gossip: testTimings,
		Logger: zaptest.NewLogger(t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	rec := newRecorder()
	g, err := Start(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown() })
	return &node{g, rec}
}

// cluster starts n nodes n0..n<n-1> joined through n0.
func cluster(t testing.TB, n int, opts ...nodeOpt) []*node {
	t.Helper()
	nodes := make([]*node, n)
	for i := range n {
		nodes[i] = start(t, fmt.Sprintf("n%d", i), 1, opts...)
		if i > 0 {
			if k, err := nodes[i].Join([]string{nodes[0].Self().GossipAddress}); err != nil || k != 1 {
				t.Fatalf("join: %d, %v", k, err)
			}
		}
	}
	// Members may list a node a moment before its Join reaches the
	// handler: wait for both.
	for _, nd := range nodes {
		poll.Until(t, nd.Self().Name+" sees every member", func() bool { return len(nd.Members()) == n })
		poll.Until(t, nd.Self().Name+" was told of every join", func() bool {
			joins := 0
			for _, e := range nd.rec.all() {
				if e.join {
					joins++
				}
			}
			return joins >= n-1
		})
	}
	return nodes
}
