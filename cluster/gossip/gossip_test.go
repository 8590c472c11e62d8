package gossip

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster/gossip/gossiptest"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/poll"
)

func TestJoin(t *testing.T) {
	nodes := cluster(t, 5)
	for _, nd := range nodes {
		ms := nd.Members()
		for i, m := range ms {
			want := nodes[i].Self()
			if m != want {
				t.Errorf("%s: member %d is %+v, want %+v", nd.Self().Name, i, m, want)
			}
			if got, ok := nd.Alive(want.Name); !ok || got != want {
				t.Errorf("%s: Alive(%s) = %+v, %v", nd.Self().Name, want.Name, got, ok)
			}
		}
		// Every other node was reported once, with what it published.
		joined := map[string]Member{}
		for _, e := range nd.rec.all() {
			if !e.join {
				t.Errorf("%s: %v on a healthy cluster", nd.Self().Name, e)
				continue
			}
			if _, dup := joined[e.m.Name]; dup {
				t.Errorf("%s: %v twice", nd.Self().Name, e)
			}
			joined[e.m.Name] = e.m
		}
		for _, other := range nodes {
			if other == nd {
				if _, ok := joined[other.Self().Name]; ok {
					t.Errorf("%s: reported its own join", nd.Self().Name)
				}
				continue
			}
			if got := joined[other.Self().Name]; got != other.Self() {
				t.Errorf("%s: joined %+v, want %+v", nd.Self().Name, got, other.Self())
			}
		}
		// Probes go both ways within a few probe intervals.
		poll.Until(t, "probes counted", func() bool { st := nd.Stats(); return st.PacketsSent > 0 && st.PacketsReceived > 0 })
		st := nd.Stats()
		if st.Members != 5 || st.PacketBytesSent == 0 || st.PacketBytesReceived == 0 || st.PushPulls == 0 ||
			st.StreamsDialed+st.StreamsAccepted == 0 || st.StreamBytesSent == 0 || st.StreamBytesReceived == 0 {
			t.Errorf("%s: stats %+v", nd.Self().Name, st)
		}
	}
	if _, ok := nodes[0].Alive("nobody"); ok {
		t.Error("Alive(nobody)")
	}
	if s := nodes[0].Self(); !strings.HasPrefix(s.GossipAddress, "127.0.0.1:") || s.GossipAddress == "127.0.0.1:0" {
		t.Errorf("Self().GossipAddress = %q, want the bound port", s.GossipAddress)
	}
}

func TestJoinToleratesUnreachableSeeds(t *testing.T) {
	a := start(t, "a1", 1)
	b := start(t, "b2", 1)
	// A port nothing listens on: the listener is closed before the join.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	n, err := b.Join([]string{dead, b.Self().GossipAddress, a.Self().GossipAddress, ""})
	if err != nil || n != 1 {
		t.Fatalf("Join = %d, %v; want 1 contacted", n, err)
	}
	a.rec.next(t, "a sees b", func(e event) bool { return e.join && e.m.Name == "b2" })
	if n, err := b.Join([]string{dead}); err == nil || n != 0 {
		t.Fatalf("Join of only an unreachable seed = %d, %v; want an error", n, err)
	}
	if n, err := b.Join([]string{b.Self().GossipAddress}); err != nil || n != 0 {
		t.Fatalf("Join of itself = %d, %v; want 0, nil", n, err)
	}
}

func TestJoinStopsAfterFanout(t *testing.T) {
	nodes := cluster(t, JoinFanout+5)
	late := start(t, "z9", 1)
	var seeds []string
	for _, nd := range nodes {
		seeds = append(seeds, nd.Self().GossipAddress)
	}
	n, err := late.Join(seeds)
	if err != nil || n != JoinFanout {
		t.Fatalf("Join = %d, %v; want %d", n, err, JoinFanout)
	}
	// One stream per seed contacted (a push-pull or a fallback ping may
	// add one or two), far from one per seed.
	if st := late.Stats(); st.StreamsDialed < JoinFanout || st.StreamsDialed >= uint64(len(nodes)) {
		t.Errorf("dialed %d streams, want %d", st.StreamsDialed, JoinFanout)
	}
	poll.Until(t, "the late node sees everyone", func() bool { return len(late.Members()) == len(nodes)+1 })
}

func TestKilledNodeIsDetected(t *testing.T) {
	nodes := cluster(t, 4)
	victim := nodes[3]
	was := victim.Self()
	start := time.Now()
	victim.Shutdown() // no Leave: the others must detect it
	for _, nd := range nodes[:3] {
		e := nd.rec.next(t, nd.Self().Name+" sees n3 leave", func(e event) bool { return !e.join && e.m.Name == "n3" })
		took := time.Since(start)
		if e.m != was || !strings.HasPrefix(e.reason, "dead") {
			t.Errorf("%s: %v, want Leave(%+v, dead...)", nd.Self().Name, e, was)
		}
		t.Logf("%s: %v after %v", nd.Self().Name, e, took)
		if bound := detectBound(testTimings, 4); took > bound {
			t.Errorf("%s: detected after %v, beyond %v", nd.Self().Name, took, bound)
		}
		if _, ok := nd.Alive("n3"); ok {
			t.Errorf("%s: n3 still alive", nd.Self().Name)
		}
	}
	// Nobody else was declared down.
	for _, nd := range nodes[:3] {
		for _, e := range nd.rec.leaves() {
			if e.m.Name != "n3" {
				t.Errorf("%s: false %v", nd.Self().Name, e)
			}
		}
	}
}

func TestFrozenNodeIsDetected(t *testing.T) {
	f := new(gossiptest.Freezer)
	nodes := make([]*node, 4)
	for i := range nodes {
		var opts []nodeOpt
		if i == 3 {
			opts = append(opts, withTransport(f.Wrap))
		}
		nodes[i] = start(t, fmt.Sprintf("n%d", i), 1, opts...)
		if i > 0 {
			if _, err := nodes[i].Join([]string{nodes[0].Self().GossipAddress}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, nd := range nodes {
		poll.Until(t, "everyone sees 4", func() bool { return len(nd.Members()) == 4 })
	}
	start := time.Now()
	f.Freeze()
	if !f.Frozen() {
		t.Fatal("not frozen")
	}
	for _, nd := range nodes[:3] {
		e := nd.rec.next(t, nd.Self().Name+" sees frozen n3 leave", func(e event) bool { return !e.join && e.m.Name == "n3" })
		took := time.Since(start)
		if !strings.HasPrefix(e.reason, "dead") {
			t.Errorf("%s: %v, want a dead reason", nd.Self().Name, e)
		}
		t.Logf("%s: %v after %v", nd.Self().Name, e, took)
		if bound := detectBound(testTimings, 4); took > bound {
			t.Errorf("%s: detected after %v, beyond %v", nd.Self().Name, took, bound)
		}
	}
	// Thawed, it refutes and comes back with the same incarnation: Join
	// again after the Leave.
	f.Thaw()
	if _, err := nodes[3].Join([]string{nodes[0].Self().GossipAddress}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[:3] {
		nd.rec.next(t, nd.Self().Name+" sees n3 back", func(e event) bool { return e.join && e.m.Name == "n3" && e.m.Incarnation == 1 })
	}
}

func TestGracefulLeave(t *testing.T) {
	// Failure detection slow enough that only the leave message explains
	// a prompt Leave.
	slow := testTimings
	slow.SuspicionMult = 40
	nodes := cluster(t, 3, withTimings(slow))
	if err := nodes[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[:2] {
		e := nd.rec.next(t, nd.Self().Name+" sees n2 leave", func(e event) bool { return !e.join && e.m.Name == "n2" })
		if e.reason != "left" {
			t.Errorf("%s: %v, want reason left", nd.Self().Name, e)
		}
	}
	if err := nodes[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Leave(time.Second); err == nil {
		t.Error("Leave after Shutdown succeeded")
	}
	if _, err := nodes[2].Join([]string{nodes[0].Self().GossipAddress}); err == nil {
		t.Error("Join after Shutdown succeeded")
	}
	if err := nodes[2].Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func TestRestartWithHigherIncarnation(t *testing.T) {
	// Slow failure detection: the restart is seen before the death.
	slow := testTimings
	slow.SuspicionMult = 40
	nodes := cluster(t, 3, withTimings(slow))
	old := nodes[2].Self()
	nodes[2].Shutdown()
	// The same name and gossip address, a new process.
	re := start(t, "n2", 2, withTimings(slow), withAddr(old.GossipAddress))
	if _, err := re.Join([]string{nodes[0].Self().GossipAddress}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[:2] {
		e := nd.rec.next(t, "old incarnation leaves", func(e event) bool { return e.m.Name == "n2" && !e.join })
		if e.m != old || e.reason != "restarted as incarnation 2" {
			t.Errorf("%s: %v, want Leave(n2#1, restarted as incarnation 2)", nd.Self().Name, e)
		}
		e = nd.rec.next(t, "new incarnation joins", func(e event) bool { return e.m.Name == "n2" })
		if !e.join || e.m != re.Self() {
			t.Errorf("%s: %v, want Join(%+v)", nd.Self().Name, e, re.Self())
		}
		if m, ok := nd.Alive("n2"); !ok || m.Incarnation != 2 {
			t.Errorf("%s: Alive(n2) = %+v, %v", nd.Self().Name, m, ok)
		}
	}
}

func TestRestartOnAnotherAddress(t *testing.T) {
	nodes := cluster(t, 3)
	nodes[2].Shutdown()
	for _, nd := range nodes[:2] {
		nd.rec.next(t, "n2 declared dead", func(e event) bool { return e.m.Name == "n2" && !e.join })
	}
	// A new process on a new port takes the name over.
	re := start(t, "n2", 5)
	if _, err := re.Join([]string{nodes[0].Self().GossipAddress}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes[:2] {
		e := nd.rec.next(t, "n2#5 joins", func(e event) bool { return e.m.Name == "n2" })
		if !e.join || e.m != re.Self() {
			t.Errorf("%s: %v, want Join(%+v)", nd.Self().Name, e, re.Self())
		}
	}
}

func TestOtherClusterOrSecretNeverJoins(t *testing.T) {
	a := start(t, "a1", 1)
	for _, tc := range []struct {
		name string
		opt  nodeOpt
	}{
		{"wrong secret", withSecret("another secret of enough bytes")},
		{"other cluster", withCluster("other")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := start(t, "b2", 1, tc.opt)
			if n, err := b.Join([]string{a.Self().GossipAddress}); err == nil || n != 0 {
				t.Fatalf("Join = %d, %v; want refused", n, err)
			}
			// a learns nothing either: b never got in.
			if ms := a.Members(); len(ms) != 1 {
				t.Errorf("a's members %v", ms)
			}
			if ms := b.Members(); len(ms) != 1 {
				t.Errorf("b's members %v", ms)
			}
			if st := a.Stats(); st.PushPulls != 0 {
				t.Errorf("a exchanged state: %+v", st)
			}
		})
	}
	if ev := a.rec.all(); len(ev) != 0 {
		t.Errorf("a saw %v", ev)
	}
}

func TestGarbageCostsNothing(t *testing.T) {
	a := start(t, "a1", 1)
	addr := a.Self().GossipAddress
	junk := [][]byte{
		{}, {0}, {0xff}, []byte("hello"),
		append([]byte{1, 0, 0, 0, 0}, make([]byte, 40)...),                                        // an encrypted message of a wrong key
		{244, 20, 't', 'e', 'n', 's', 'o', 'r', 'f', 'e', 'r', 'r', 'y', '/', 't', 'e', 's', 't'}, // a label, then nothing
		append([]byte{0x01, 0xff, 0xff, 0xff, 0xff}, 1, 2, 3),                                     // a huge length header
		[]byte(strings.Repeat("x", 60000)),
	}
	// UDP.
	uc, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	for range 20 {
		for _, j := range junk {
			uc.Write(j)
		}
	}
	// TCP: each junk on its own stream, some left open.
	var open []net.Conn
	for _, j := range junk {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(j)
		open = append(open, c)
	}
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	// a still works: a real node joins it, and nothing else did.
	b := start(t, "b2", 1)
	if _, err := b.Join([]string{addr}); err != nil {
		t.Fatal(err)
	}
	a.rec.next(t, "b joins a", func(e event) bool { return e.join && e.m.Name == "b2" })
	if ms := a.Members(); len(ms) != 2 {
		t.Errorf("members %v", ms)
	}
	poll.Until(t, "a counted the junk", func() bool { return a.Stats().StreamsAccepted >= uint64(len(junk)) })
	// The streams of junk are closed by a (they never authenticate).
	for _, c := range open[:4] {
		c.SetReadDeadline(time.Now().Add(poll.Deadline))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("junk stream got an answer")
		}
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	good := Config{Cluster: "c", Secret: []byte(testSecret), Self: Member{Name: "n", Address: "127.0.0.1:1", DataAddress: "127.0.0.1:2", GossipAddress: "127.0.0.1:0"}}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"bad cluster", func(c *Config) { c.Cluster = "a b" }, "gossip: cluster: "},
		{"short secret", func(c *Config) { c.Secret = []byte("short") }, "gossip: secret is 5 bytes"},
		{"bad name", func(c *Config) { c.Self.Name = "" }, "gossip: self name: required"},
		{"bad address", func(c *Config) { c.Self.Address = "nowhere" }, "gossip: self address: "},
		{"bad data address", func(c *Config) { c.Self.DataAddress = "h:0" }, "gossip: self data address: "},
		{"bad gossip address", func(c *Config) { c.Self.GossipAddress = "127.0.0.1" }, "gossip: gossip address "},
		{"bad gossip port", func(c *Config) { c.Self.GossipAddress = "127.0.0.1:70000" }, "gossip: gossip address "},
		{"bad timings", func(c *Config) { c.Gossip.ProbeInterval, c.Gossip.ProbeTimeout = time.Second, 2*time.Second }, "gossip: config: gossip.probe_timeout"},
		{"long addresses", func(c *Config) {
			c.Self.Address = strings.Repeat("a", 255) + ":1"
			c.Self.DataAddress = strings.Repeat("b", 255) + ":1"
		}, "gossip: addresses too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.change(&cfg)
			g, err := Start(cfg, newRecorder())
			if err == nil {
				g.Shutdown()
				t.Fatal("started")
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want %s...", err, tc.want)
			}
		})
	}
	if _, err := Start(good, nil); err == nil {
		t.Error("started without Events")
	}
	// A taken port is an error, not a retry elsewhere.
	a := start(t, "a1", 1)
	cfg := good
	cfg.Self.GossipAddress = a.Self().GossipAddress
	if g, err := Start(cfg, newRecorder()); err == nil {
		g.Shutdown()
		t.Error("started on a taken address")
	}
}

func TestKeyDerivation(t *testing.T) {
	k1, err := deriveKey([]byte(testSecret), "a")
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := deriveKey([]byte(testSecret), "b")
	k3, _ := deriveKey([]byte(testSecret+"x"), "a")
	k4, _ := deriveKey([]byte(testSecret), "a")
	if len(k1) != 32 || string(k1) == string(k2) || string(k1) == string(k3) || string(k1) != string(k4) {
		t.Errorf("keys %x %x %x %x", k1, k2, k3, k4)
	}
	if string(k1) == testSecret[:32] {
		t.Error("the key is the secret")
	}
	_ = config.MinSecretLen
}
