package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestGossipDefaultsFollowFailureTimeout(t *testing.T) {
	for _, tc := range []struct {
		failure time.Duration
		want    GossipConfig
	}{
		{0, GossipConfig{ProbeInterval: 250 * time.Millisecond, ProbeTimeout: 125 * time.Millisecond, SuspicionMult: 3,
			SuspicionMaxTimeoutMult: 4, GossipInterval: 100 * time.Millisecond, GossipNodes: 3,
			PushPullInterval: 30 * time.Second, RetransmitMult: 4, TCPTimeout: 2 * time.Second}},
		{3 * time.Second, DefaultGossipConfig(0)},
		{6 * time.Second, GossipConfig{ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 250 * time.Millisecond, SuspicionMult: 3,
			SuspicionMaxTimeoutMult: 4, GossipInterval: 200 * time.Millisecond, GossipNodes: 3,
			PushPullInterval: 30 * time.Second, RetransmitMult: 4, TCPTimeout: 2 * time.Second}},
		// The probe interval never goes below its minimum.
		{21 * time.Millisecond, GossipConfig{ProbeInterval: MinProbeInterval, ProbeTimeout: MinProbeInterval / 2, SuspicionMult: 3,
			SuspicionMaxTimeoutMult: 4, GossipInterval: time.Millisecond, GossipNodes: 3,
			PushPullInterval: 30 * time.Second, RetransmitMult: 4, TCPTimeout: 2 * time.Second}},
	} {
		if got := DefaultGossipConfig(tc.failure); got != tc.want {
			t.Errorf("DefaultGossipConfig(%v) = %+v, want %+v", tc.failure, got, tc.want)
		}
		if err := tc.want.Validate(); err != nil {
			t.Errorf("defaults for %v: %v", tc.failure, err)
		}
	}
	// The detection bound of the doc: 2 probe intervals plus the smallest
	// suspicion timeout fit in failure_timeout up to 2000 nodes.
	g := DefaultGossipConfig(3 * time.Second)
	log10of2000 := 3.302
	if d := time.Duration((2 + float64(g.SuspicionMult)*log10of2000) * float64(g.ProbeInterval)); d > 3*time.Second {
		t.Errorf("detection at 2000 nodes %v exceeds failure_timeout", d)
	}
	// A set probe interval gives the probe timeout its default.
	if got := (GossipConfig{ProbeInterval: time.Second}).WithDefaults(0); got.ProbeTimeout != 500*time.Millisecond {
		t.Errorf("probe timeout %v, want half of the probe interval", got.ProbeTimeout)
	}
}

func TestParseGossip(t *testing.T) {
	dir := secretDir(t, testSecret)
	c, err := Parse([]byte(strings.Replace(base, "nodes:", `failure_timeout: 6s
gossip:
  probe_interval: 1s
  probe_timeout: 300ms
  suspicion_mult: 5
  suspicion_max_timeout_mult: 7
  gossip_interval: 50ms
  gossip_nodes: 4
  push_pull_interval: 1m
  retransmit_mult: 2
  tcp_timeout: 3s
nodes:`, 1)+"    gossip_address: 10.0.0.2:9999\n"), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := GossipConfig{ProbeInterval: time.Second, ProbeTimeout: 300 * time.Millisecond, SuspicionMult: 5, SuspicionMaxTimeoutMult: 7,
		GossipInterval: 50 * time.Millisecond, GossipNodes: 4, PushPullInterval: time.Minute, RetransmitMult: 2, TCPTimeout: 3 * time.Second}
	if c.Gossip != want {
		t.Errorf("gossip %+v, want %+v", c.Gossip, want)
	}
	if a, b := c.Nodes[0].GossipAddress, c.Nodes[1].GossipAddress; a != "127.0.0.1:7201" || b != "10.0.0.2:9999" {
		t.Errorf("gossip addresses %q %q", a, b)
	}

	// Left out, the timings follow failure_timeout.
	c, err = Parse([]byte(strings.Replace(base, "nodes:", "failure_timeout: 6s\nnodes:", 1)), dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Gossip != DefaultGossipConfig(6*time.Second) {
		t.Errorf("gossip %+v, want the defaults for 6s", c.Gossip)
	}

	// Marshal writes them and Parse reads them back.
	c.Nodes[1].GossipAddress = "[::1]:7999"
	roundTrip(t, c, dir)
}

func TestParseGossipInvalid(t *testing.T) {
	dir := secretDir(t, testSecret)
	for _, tc := range []struct{ name, yaml, want string }{
		{"probe timeout not below interval", strings.Replace(base, "nodes:", "gossip:\n  probe_interval: 100ms\n  probe_timeout: 100ms\nnodes:", 1),
			`config: line 5: gossip.probe_timeout: 100ms must be below probe_interval (100ms)`},
		{"probe interval below minimum", strings.Replace(base, "nodes:", "gossip:\n  probe_interval: 1ms\n  probe_timeout: 500us\nnodes:", 1),
			`config: line 4: gossip.probe_interval: 1ms is below the minimum of 10ms`},
		{"push pull below a second", strings.Replace(base, "nodes:", "gossip:\n  push_pull_interval: 10ms\nnodes:", 1),
			`config: line 4: gossip.push_pull_interval: 10ms is below the minimum of 1s`},
		{"too many gossip nodes", strings.Replace(base, "nodes:", "gossip:\n  gossip_nodes: 65\nnodes:", 1),
			`config: line 4: gossip.gossip_nodes: 65 is outside 1..64`},
		{"zero suspicion mult", strings.Replace(base, "nodes:", "gossip:\n  suspicion_mult: 0\nnodes:", 1),
			`config: line 4: gossip.suspicion_mult: bad count "0": want a positive integer`},
		{"huge retransmit mult", strings.Replace(base, "nodes:", "gossip:\n  retransmit_mult: 101\nnodes:", 1),
			`config: line 4: gossip.retransmit_mult: 101 is outside 1..100`},
		{"unknown gossip key", strings.Replace(base, "nodes:", "gossip:\n  probes: 3\nnodes:", 1),
			`config: line 4: gossip.probes: unknown key`},
		{"bad duration", strings.Replace(base, "nodes:", "gossip:\n  tcp_timeout: soon\nnodes:", 1),
			`config: line 4: gossip.tcp_timeout: bad duration "soon"`},
		{"gossip address without port", strings.Replace(base, "7001\n", "7001\n    gossip_address: 127.0.0.1\n", 1),
			`config: line 6: nodes[0].gossip_address: "127.0.0.1": want host:port`},
		{"gossip address is own data address", strings.Replace(base, "7001\n", "7001\n    gossip_address: 127.0.0.1:7101\n", 1),
			`config: line 6: nodes[0].gossip_address: duplicate of nodes[0].data_address ("127.0.0.1:7101")`},
		{"default gossip address is another's data address", strings.Replace(base, "7002\n", "7002\n    data_address: 127.0.0.1:7201\n", 1),
			`config: line 8: nodes[1].data_address: duplicate of nodes[0].gossip_address ("127.0.0.1:7201")`},
		{"default gossip address taken", strings.Replace(base, "7001\n", "7001\n    data_address: 127.0.0.1:7202\n", 1),
			`config: line 7: nodes[1].gossip_address: duplicate of nodes[0].data_address ("127.0.0.1:7202") (the default, control port + 200): set gossip_address`},
		{"no room for gossip port", strings.Replace(base, "127.0.0.1:7001", "127.0.0.1:65400", 1),
			`config: line 5: nodes[0].address: port 65400 leaves no room for the default gossip port (+200): set gossip_address`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), dir)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestCheckAddress(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:1", "[::1]:65535", "host.example:7946", strings.Repeat("h", 253) + ":65535"} {
		if err := CheckAddress(ok); err != nil {
			t.Errorf("CheckAddress(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ":7946", "host", "host:0", "host:65536", "host:-1", "ho st:1", "host\x00:1",
		"host:1\n", strings.Repeat("h", 256) + ":65535", "[::1:5"} {
		if err := CheckAddress(bad); err == nil {
			t.Errorf("CheckAddress(%q) accepted", bad)
		}
	}
	if err := CheckName("node-1.a_b"); err != nil {
		t.Error(err)
	}
	if err := CheckName("node/1"); err == nil {
		t.Error("CheckName accepted a slash")
	}
}

func TestParseMeshOnly(t *testing.T) {
	dir := secretDir(t, testSecret)
	c, err := Parse([]byte(strings.Replace(base, "nodes:", "membership: gossip\nnodes:", 1)+"    mesh_only: true\n"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := c.Nodes[0], c.Nodes[1]; a.MeshOnly || a.GossipAddress != "127.0.0.1:7201" || !b.MeshOnly || b.GossipAddress != "" {
		t.Errorf("nodes %+v %+v: want a gossiping with the default address, b mesh-only without one", a, b)
	}
	// Its default gossip port stays free for another node.
	if _, err := Parse([]byte(base+"    mesh_only: true\n  - name: c\n    address: 127.0.0.1:7003\n    data_address: 127.0.0.1:7202\n"), dir); err != nil {
		t.Errorf("a mesh-only node's default gossip port taken: %v", err)
	}
	roundTrip(t, c, dir)
}

func TestParseMeshOnlyInvalid(t *testing.T) {
	dir := secretDir(t, testSecret)
	disc := "membership: gossip\ndiscovery:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\nnodes:"
	for _, tc := range []struct{ name, yaml, want string }{
		{"gossip address", base + "    mesh_only: true\n    gossip_address: 127.0.0.1:7999\n",
			`config: line 9: nodes[1].gossip_address: set on a mesh_only node, which does not gossip: leave it out`},
		{"not a boolean", base + "    mesh_only: yes please\n",
			`config: line 8: nodes[1].mesh_only: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), dir)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
	// With mesh membership and discovery it is allowed (and changes
	// nothing); with gossip and discovery the node registers the mark.
	if _, err := Parse([]byte(strings.Replace(strings.Replace(base, "nodes:", disc, 1), "gossip", "mesh", 1)+"    mesh_only: true\n"), dir); err != nil {
		t.Errorf("mesh membership, discovery: %v", err)
	}
	c, err := Parse([]byte(strings.Replace(base, "nodes:", disc, 1)+"    mesh_only: true\n"), dir)
	if err != nil {
		t.Fatalf("gossip membership, discovery: %v", err)
	}
	if b := c.Nodes[1]; !b.MeshOnly || b.GossipAddress != "" {
		t.Errorf("node %+v: want mesh-only without a gossip address", b)
	}
}

// roundTrip checks that Marshal writes c and Parse reads it back unchanged.
func roundTrip(t *testing.T, c *Config, dir string) {
	t.Helper()
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b, dir)
	if err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	if !reflect.DeepEqual(public(back), public(c)) {
		t.Errorf("round trip\n%+v\n%+v\n%s", public(back), public(c), b)
	}
}
