package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

// etcdBase has a discovery section and no nodes; line numbers of the
// cases below count from it.
const etcdBase = `cluster: demo
secret_file: secret.key
discovery:
  etcd:
    endpoints: [http://127.0.0.1:2379, "https://etcd-2.example:2379"]
`

func TestParseDiscovery(t *testing.T) {
	c, err := Parse([]byte(etcdBase), secretDir(t, testSecret))
	if err != nil {
		t.Fatal(err)
	}
	want := &DiscoveryConfig{Etcd: &EtcdConfig{
		Endpoints: []string{"http://127.0.0.1:2379", "https://etcd-2.example:2379"},
		Prefix:    "/tensorferry/", LeaseTTL: 10 * time.Second, DialTimeout: 2 * time.Second,
	}}
	if !reflect.DeepEqual(c.Discovery, want) || len(c.Nodes) != 0 {
		t.Errorf("discovery %+v, nodes %v; want %+v and none", c.Discovery.Etcd, c.Nodes, want.Etcd)
	}

	c, err = Parse([]byte(etcdBase+"    prefix: /x/\n    lease_ttl: 3s\n    dial_timeout: 500ms\nnodes:\n  - name: a\n    address: 127.0.0.1:7001\n"), secretDir(t, testSecret))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Discovery.Etcd; e.Prefix != "/x/" || e.LeaseTTL != 3*time.Second || e.DialTimeout != 500*time.Millisecond || len(c.Nodes) != 1 {
		t.Errorf("discovery %+v, nodes %v", e, c.Nodes)
	}

	// Marshal writes the section back.
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b, c.dir)
	if err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	if got, want := public(back), public(c); !reflect.DeepEqual(got, want) {
		t.Errorf("round trip\ngot  %+v\nwant %+v\nYAML:\n%s", got.Discovery.Etcd, want.Discovery.Etcd, b)
	}
}

// A discovery section goes with either membership: gossip by default,
// the mesh when the file says so (issue 33: a Python node cannot gossip).
func TestDiscoveryMembership(t *testing.T) {
	for _, tt := range []struct{ membership, want string }{
		{"", MembershipGossip},
		{"membership: gossip\n", MembershipGossip},
		{"membership: mesh\n", MembershipMesh},
	} {
		c, err := Parse([]byte(tt.membership+etcdBase), secretDir(t, testSecret))
		if err != nil {
			t.Fatalf("%q: %v", tt.membership, err)
		}
		if got := c.MembershipMode(); got != tt.want {
			t.Errorf("%q: membership %q, want %q", tt.membership, got, tt.want)
		}
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(b, c.dir)
		if err != nil || back.MembershipMode() != tt.want {
			t.Errorf("%q: round trip: %v, membership %q", tt.membership, err, back.MembershipMode())
		}
	}
}

func TestParseDiscoveryInvalid(t *testing.T) {
	for _, tt := range []struct{ name, yaml, want string }{
		{"no nodes without discovery", "cluster: demo\nsecret_file: secret.key\n",
			`config: line 1: nodes: at least one node is required (or a discovery section)`},
		{"no source", "cluster: demo\nsecret_file: secret.key\ndiscovery: {}\n",
			`config: line 3: discovery: name a source: etcd`},
		{"unknown source", "cluster: demo\nsecret_file: secret.key\ndiscovery:\n  consul: {}\n",
			`config: line 4: discovery.consul: unknown key (the sources are: etcd)`},
		{"unknown key", etcdBase + "    ttl: 3s\n",
			`config: line 6: discovery.etcd.ttl: unknown key`},
		{"no endpoints", strings.Replace(etcdBase, `[http://127.0.0.1:2379, "https://etcd-2.example:2379"]`, "[]", 1),
			`config: line 5: discovery.etcd.endpoints: at least one endpoint is required`},
		{"endpoint without scheme", strings.Replace(etcdBase, "http://127.0.0.1:2379", "127.0.0.1:2379", 1),
			`config: line 5: discovery.etcd.endpoints[0]: "127.0.0.1:2379": want http://host:port`},
		{"endpoint without port", strings.Replace(etcdBase, "https://etcd-2.example:2379", "https://etcd-2.example", 1),
			`config: line 5: discovery.etcd.endpoints[1]: "etcd-2.example": want host:port`},
		{"endpoint with path", strings.Replace(etcdBase, "http://127.0.0.1:2379", "http://127.0.0.1:2379/v3", 1),
			`config: line 5: discovery.etcd.endpoints[0]: "http://127.0.0.1:2379/v3": want only scheme, host and port`},
		{"duplicate endpoint", strings.Replace(etcdBase, "https://etcd-2.example:2379", "http://127.0.0.1:2379", 1),
			`config: line 5: discovery.etcd.endpoints[1]: duplicate of endpoints[0]`},
		{"prefix with a space", etcdBase + "    prefix: \"/a b/\"\n",
			`config: line 6: discovery.etcd.prefix: "/a b/": want printable ASCII without spaces`},
		{"lease too short", etcdBase + "    lease_ttl: 1s\n",
			`config: line 6: discovery.etcd.lease_ttl: 1s is outside 2s..1h0m0s`},
		{"lease not whole seconds", etcdBase + "    lease_ttl: 2500ms\n",
			`config: line 6: discovery.etcd.lease_ttl: 2.5s: want whole seconds`},
		{"dial timeout too short", etcdBase + "    dial_timeout: 1ms\n",
			`config: line 6: discovery.etcd.dial_timeout: 1ms is below the minimum of 10ms`},
		{"etcd is a list", "cluster: demo\nsecret_file: secret.key\ndiscovery:\n  etcd: [a]\n",
			`config: line 4: discovery.etcd: want a mapping of keys, got a list`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), secretDir(t, testSecret))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not match ErrInvalid", err)
			}
		})
	}
}

func TestCheckNode(t *testing.T) {
	n := NodeConfig{Name: "a", Address: "localhost:7000"}
	if err := CheckNode(&n); err != nil {
		t.Fatal(err)
	}
	if n.DataAddress != "localhost:7100" || n.GossipAddress != "localhost:7200" || !reflect.DeepEqual(n.Devices, []memory.Device{memory.CPU}) {
		t.Errorf("completed as %+v", n)
	}
	// A mesh_only node has no gossip address (its default port may be
	// another's).
	m := NodeConfig{Name: "m", Address: "localhost:65400", DataAddress: "localhost:7000", MeshOnly: true}
	if err := CheckNode(&m); err != nil || m.GossipAddress != "" {
		t.Errorf("mesh_only node: %v, completed as %+v", err, m)
	}
	for _, tt := range []struct {
		n    NodeConfig
		want string
	}{
		{NodeConfig{Address: "h:1"}, "name: required"},
		{NodeConfig{Name: "a", Address: "h:1", GossipAddress: "h:7", MeshOnly: true}, "gossip_address: set on a mesh_only node"},
		{NodeConfig{Name: "a/b", Address: "h:1"}, "name: "},
		{NodeConfig{Name: "a", Address: "h"}, "address: "},
		{NodeConfig{Name: "a", Address: "h:65500"}, "no room for the default data port"},
		{NodeConfig{Name: "a", Address: "h:1", DataAddress: "h:0"}, "data_address: "},
		{NodeConfig{Name: "a", Address: "h:1", DataAddress: "h:1"}, "same as address"},
		{NodeConfig{Name: "a", Address: "h:1", Pprof: true}, "the node's own settings"},
		{NodeConfig{Name: "a", Address: "h:65400"}, "no room for the default gossip port"},
		{NodeConfig{Name: "a", Address: "h:1", GossipAddress: "h:x"}, "gossip_address: "},
		{NodeConfig{Name: "a", Address: "h:1", GossipAddress: "h:101"}, "gossip_address: same as"},
		{NodeConfig{Name: "a", Address: "h:1", Devices: []memory.Device{memory.CPU, memory.CPU}}, "devices[1]: duplicate"},
		{NodeConfig{Name: "a", Address: "h:1", Devices: []memory.Device{{Kind: 99}}}, "devices[0]: "},
		{NodeConfig{Name: "a", Address: "h:1", Devices: make([]memory.Device, MaxNodeDevices+1)}, "at most"},
	} {
		if err := CheckNode(&tt.n); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CheckNode(%+v) = %v, want an error with %q", tt.n, err, tt.want)
		}
	}
	if CheckName("ok-name_1.x") != nil || CheckName("") == nil {
		t.Error("CheckName")
	}
}
