package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/discovery"
	"github.com/tensorferry/tensorferry/internal/poll"
	"github.com/tensorferry/tensorferry/wire"
)

// unreachable is a Network where every dial fails at once, naming the
// address.
type unreachable struct{}

func (unreachable) Listen(string) (net.Listener, error) {
	return nil, errors.New("unreachable: no listening")
}
func (unreachable) DialContext(_ context.Context, addr string) (net.Conn, error) {
	return nil, fmt.Errorf("unreachable: no route to %s", addr)
}

// The full mesh takes at most MaxMeshAnnounced nodes from discovery: a
// writer under the etcd prefix cannot make a node hold a dialer and a
// connection per name it writes. A node reported gone frees its place.
func TestMeshAnnouncedBounded(t *testing.T) {
	cfg, err := config.LocalConfig("m", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipMesh
	cfg.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := NewMembership(cfg, "node0", 1, nopHandler{}, Options{Network: unreachable{}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	node := func(i int) config.NodeConfig {
		return config.NodeConfig{Name: fmt.Sprintf("n%d", i), Address: fmt.Sprintf("10.0.0.1:%d", 2000+i),
			DataAddress: fmt.Sprintf("10.0.0.2:%d", 2000+i)}
	}
	for i := range MaxMeshAnnounced + 1 {
		m.discovered(discovery.Event{Kind: discovery.Joined, Node: node(i)})
	}
	// The config's node1 and the first MaxMeshAnnounced announced.
	if got := len(m.Members()); got != 1+MaxMeshAnnounced {
		t.Fatalf("%d members, want %d", got, 1+MaxMeshAnnounced)
	}
	extra := node(MaxMeshAnnounced).Name
	if m.Known(extra) || !m.Known("n0") || !m.Known("node1") {
		t.Fatalf("known: %s %v, n0 %v, node1 %v", extra, m.Known(extra), m.Known("n0"), m.Known("node1"))
	}
	var ce *wire.ConnError
	if err := m.notMember(extra); !errors.As(err, &ce) || ce.Code != wire.CodeNotFound {
		t.Errorf("a node beyond the bound: %v, want a NotFound refusal", err)
	}
	// n0 goes: its dialer stops, its slot is forgotten, and the next
	// announcement takes its place.
	m.discovered(discovery.Event{Kind: discovery.Left, Node: node(0), Reason: discovery.ReasonLeaseExpired})
	poll.Until(t, "n0 forgotten", func() bool { return errors.Is(m.LastError("n0"), ErrUnknownNode) })
	m.discovered(discovery.Event{Kind: discovery.Joined, Node: node(MaxMeshAnnounced)})
	if !m.Known(extra) || m.Known("n0") {
		t.Fatalf("after n0 left: %s known %v, n0 known %v", extra, m.Known(extra), m.Known("n0"))
	}
	// A node registered again with other addresses (Left "changed", then
	// Joined) stays known, at its new addresses.
	moved := node(1)
	moved.Address, moved.DataAddress = "10.0.0.3:1", "10.0.0.3:2"
	m.discovered(discovery.Event{Kind: discovery.Left, Node: node(1), Reason: discovery.ReasonChanged})
	if !m.Known("n1") {
		t.Fatal("n1 not known while it changes addresses")
	}
	m.discovered(discovery.Event{Kind: discovery.Joined, Node: moved})
	if _, err := m.DialData(context.Background(), "n1", "staging"); err == nil || !strings.Contains(err.Error(), "no route to "+moved.DataAddress) {
		t.Fatalf("DialData n1: %v", err)
	}
	for _, n := range m.Members() {
		if n.Name == "n1" && n.Address != moved.Address {
			t.Errorf("n1 at %s, want %s", n.Address, moved.Address)
		}
	}
	// The config's node reported gone keeps its slot, refused until
	// announced again.
	m.discovered(discovery.Event{Kind: discovery.Left, Node: cfg.Nodes[1], Reason: discovery.ReasonLeft})
	if m.Known("node1") || errors.Is(m.LastError("node1"), ErrUnknownNode) {
		t.Fatalf("node1 reported gone: known %v, last error %v", m.Known("node1"), m.LastError("node1"))
	}
	if err := m.notMember("node1"); !notAliveYet(err) {
		t.Errorf("node1 reported gone: %v, want a refusal to retry", err)
	}
	m.discovered(discovery.Event{Kind: discovery.Joined, Node: cfg.Nodes[1]})
	if !m.Known("node1") {
		t.Fatal("node1 announced again: not known")
	}
}
