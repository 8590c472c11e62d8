package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/memnet"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
)

// Failure tests over memnet: faults are injected between the nodes' hosts
// (a host per node, named as the node), and every test waits for the event
// it expects (NodeDown, NodeUp, a message), never for time. Timeouts below
// only bound a test that fails.

// guard bounds the wait for one event of a failing test.
const guard = 20 * time.Second

// peerEvent is a PeerUp (up) or PeerDown seen by a recorder.
type peerEvent struct {
	up    bool
	node  string
	inc   uint64
	cause error
}

// recorder is a Handler that reports peer events and the Request ids of the
// messages it gets, in order.
type recorder struct {
	events chan peerEvent
	msgs   chan uint64

	mu  sync.Mutex
	got []uint64 // every message's Request, in arrival order

	// hook, when set, is called with every message's Request id, on the
	// goroutine that read its frame.
	hook atomic.Pointer[func(p *cluster.Peer, id uint64)]
}

func newRecorder() *recorder {
	return &recorder{events: make(chan peerEvent, 1024), msgs: make(chan uint64, 1<<16)}
}

func (r *recorder) PeerUp(p *cluster.Peer) {
	r.events <- peerEvent{up: true, node: p.Name, inc: p.Incarnation}
}

func (r *recorder) PeerDown(p *cluster.Peer, cause error) {
	r.events <- peerEvent{node: p.Name, inc: p.Incarnation, cause: cause}
}

func (r *recorder) HandleFrame(p *cluster.Peer, f wire.Frame) {
	var ids []uint64
	switch f := f.(type) {
	case *wire.MessageFrame:
		ids = append(ids, f.Message.Request)
	case *wire.MessagesFrame: // messages sent together may come in a batch
		for _, m := range f.Messages {
			ids = append(ids, m.Request)
		}
	}
	r.mu.Lock()
	r.got = append(r.got, ids...)
	r.mu.Unlock()
	hook := r.hook.Load()
	for _, id := range ids {
		if hook != nil {
			(*hook)(p, id)
		}
		r.msgs <- id
	}
}

func (r *recorder) HandleDataConn(_, _ string, conn net.Conn) { conn.Close() }

func (r *recorder) received() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// await waits for the next event of the kind (up or down) about node,
// skipping others.
func (r *recorder) await(t *testing.T, up bool, node string) peerEvent {
	t.Helper()
	timeout := time.NewTimer(guard)
	defer timeout.Stop()
	for {
		select {
		case e := <-r.events:
			if e.up == up && e.node == node {
				return e
			}
		case <-timeout.C:
			t.Fatalf("no %s event for %s", map[bool]string{true: "up", false: "down"}[up], node)
		}
	}
}

// awaitMessage waits for the message with Request id.
func (r *recorder) awaitMessage(t *testing.T, id uint64) {
	t.Helper()
	timeout := time.NewTimer(guard)
	defer timeout.Stop()
	for {
		select {
		case got := <-r.msgs:
			if got == id {
				return
			}
		case <-timeout.C:
			t.Fatalf("message %d never arrived; got %v", id, r.received())
		}
	}
}

// memConfig returns a config of n nodes, node0..node<n-1>, whose addresses
// live on memnet, with the given heartbeat and failure timeout and quick
// redials.
func memConfig(t *testing.T, n int, heartbeat, failure time.Duration) *config.Config {
	t.Helper()
	c := config.DefaultConfig()
	c.Cluster = "faults"
	c.Secret = []byte("a secret of the faults tests, 32")
	c.HeartbeatInterval = heartbeat
	c.FailureTimeout = failure
	// A dial across a stalled link waits for its timeout; keep it short so
	// that the node dials again soon after a heal.
	c.DialTimeout = 100 * time.Millisecond
	c.ReconnectMin = time.Millisecond
	c.ReconnectMax = 20 * time.Millisecond
	for i := range n {
		c.Nodes = append(c.Nodes, config.NodeConfig{Name: fmt.Sprintf("node%d", i), Address: fmt.Sprintf("node%d:7000", i)})
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Short timings for the liveness tests: a silent peer is noticed within
// 200ms. Tests that must not see a live peer declared down (one that counts
// messages) use the loopback timings instead: a machine under the race
// detector can stall a process for longer than 200ms.
const (
	fastHeartbeat = 10 * time.Millisecond
	fastFailure   = 200 * time.Millisecond
	slowHeartbeat = 100 * time.Millisecond
	slowFailure   = 5 * time.Second
)

// memNode is a started membership and what its handler saw.
type memNode struct {
	m *cluster.Membership
	r *recorder
}

// startNodes starts the config's nodes on nw (each as the host named as it,
// with incarnation index+1), all at once, and closes them at the end of the
// test after healing the network.
func startNodes(t *testing.T, nw *memnet.Network, cfg *config.Config) []memNode {
	t.Helper()
	nodes := make([]memNode, len(cfg.Nodes))
	for i, nc := range cfg.Nodes {
		r := newRecorder()
		m, err := cluster.NewMembership(cfg, nc.Name, uint64(i+1), r, cluster.Options{Caps: []byte{0x80}, Network: nw.Host(nc.Name),
			// A host per node: faults are injected between hosts.
			SharedMemory: shm.Config{HostID: "memnet host " + nc.Name}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = memNode{m, r}
	}
	t.Cleanup(func() {
		nw.Heal()
		for _, n := range nodes {
			_ = n.m.Close()
		}
	})
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() { errs <- n.m.Start() }()
	}
	for range nodes {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

// awaitUpEverywhere waits until every pair of nodes saw each other up.
func awaitUpEverywhere(t *testing.T, nodes []memNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	for _, a := range nodes {
		for _, b := range nodes {
			if a.m != b.m {
				if _, err := a.m.WaitUp(ctx, b.m.Self().Name); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestFaultStalledPeerDeclaredDown: a link that stops carrying bytes is
// silence, not an error; each side declares the other down by its failure
// detector, within the failure timeout (plus a heartbeat tick).
func TestFaultStalledPeerDeclaredDown(t *testing.T) {
	nw := memnet.New(1)
	cfg := memConfig(t, 2, fastHeartbeat, fastFailure)
	nodes := startNodes(t, nw, cfg)
	awaitUpEverywhere(t, nodes)

	stalled := time.Now()
	nw.Stall("node0", "node1")
	// The node whose failure detector fires first closes the connection;
	// the other may see that close before its own detector fires (a write
	// error): at least one must be the detector's ErrNodeDown.
	detected := 0
	for i, n := range nodes {
		e := n.r.await(t, false, cfg.Nodes[1-i].Name)
		if errors.Is(e.cause, cluster.ErrNodeDown) {
			detected++
		} else {
			t.Logf("%s: down for %v (the peer closed first)", n.m.Self().Name, e.cause)
		}
		// Late by more than a second would be a failure detector that
		// does not work (a scheduler does not stall this long).
		if late := time.Since(stalled); late > cfg.FailureTimeout+cfg.HeartbeatInterval+time.Second {
			t.Errorf("%s: declared down %v after the stall (failure timeout %v)", n.m.Self().Name, late, cfg.FailureTimeout)
		}
	}
	if detected == 0 {
		t.Fatal("no node's failure detector declared the stalled peer down")
	}
	if _, ok := nodes[0].m.Peer("node1"); ok {
		t.Fatal("node1 still up at node0")
	}
}

// TestFaultPartitionAndHeal: a partition makes each side declare the other
// down; after Heal both come up again with the incarnations they had.
func TestFaultPartitionAndHeal(t *testing.T) {
	nw := memnet.New(2)
	cfg := memConfig(t, 2, fastHeartbeat, fastFailure)
	nodes := startNodes(t, nw, cfg)
	awaitUpEverywhere(t, nodes)

	nw.Partition([]string{"node0"}, []string{"node1"})
	for i, n := range nodes {
		e := n.r.await(t, false, cfg.Nodes[1-i].Name)
		if e.inc != uint64(2-i) {
			t.Fatalf("%s: down of incarnation %d, want %d", n.m.Self().Name, e.inc, 2-i)
		}
	}
	nw.Heal()
	for i, n := range nodes {
		e := n.r.await(t, true, cfg.Nodes[1-i].Name)
		if e.inc != uint64(2-i) {
			t.Fatalf("%s: up again as incarnation %d, want %d (same process)", n.m.Self().Name, e.inc, 2-i)
		}
	}
}

// TestFaultCutConnectionRedialed: a connection reset between two nodes is
// redialed; a message sent once the peer is up again arrives.
func TestFaultCutConnectionRedialed(t *testing.T) {
	nw := memnet.New(3)
	cfg := memConfig(t, 2, slowHeartbeat, slowFailure)
	nodes := startNodes(t, nw, cfg)
	awaitUpEverywhere(t, nodes)

	nw.Cut("node0", "node1")
	for i, n := range nodes {
		n.r.await(t, false, cfg.Nodes[1-i].Name)
	}
	for i, n := range nodes {
		if e := n.r.await(t, true, cfg.Nodes[1-i].Name); e.inc != uint64(2-i) {
			t.Fatalf("%s: up again as incarnation %d, want %d", n.m.Self().Name, e.inc, 2-i)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	p, err := nodes[0].m.WaitUp(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: 7}); err != nil {
		t.Fatal(err)
	}
	nodes[1].r.awaitMessage(t, 7)
}

// twoNodesDelayed starts node0 and node1 on a memnet (seeded) whose link
// delays every write by up to maxDelay, and returns them with node0's Peer
// of node1, up.
func twoNodesDelayed(t *testing.T, seed int64, maxDelay time.Duration) ([]memNode, *cluster.Peer) {
	t.Helper()
	nw := memnet.New(seed)
	nw.Delay("node0", "node1", 0, maxDelay)
	nodes := startNodes(t, nw, memConfig(t, 2, slowHeartbeat, slowFailure))
	awaitUpEverywhere(t, nodes)
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	p, err := nodes[0].m.WaitUp(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	return nodes, p
}

// TestFaultMessagesInOrderAcrossDelayedLink: every write of the link waits
// a random time before it can be read; the messages still arrive all and
// in the order sent, single and in batches.
func TestFaultMessagesInOrderAcrossDelayedLink(t *testing.T) {
	nodes, p := twoNodesDelayed(t, 4, time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	const n = 500
	for i := range uint64(n) {
		if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: i + 1}); err != nil {
			t.Fatal(err)
		}
	}
	nodes[1].r.awaitMessage(t, n)
	got := nodes[1].r.received()
	for i, id := range got {
		if id != uint64(i+1) {
			t.Fatalf("message %d has Request %d: lost or out of order (%d received)", i+1, id, len(got))
		}
	}
	if len(got) != n {
		t.Fatalf("%d messages received, want %d", len(got), n)
	}
}

// TestFaultRequestsReadByTheirCallers: a caller waiting for its reply
// reads the memnet connection itself (the read role, Peer.Await), as over
// a socket, across a link that delays every write; every reply reaches its
// caller, in turn.
func TestFaultRequestsReadByTheirCallers(t *testing.T) {
	nodes, p := twoNodesDelayed(t, 6, 200*time.Microsecond)
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	// node1 answers every message with one of the same id; node0 hands
	// each answer to the caller waiting for it.
	echo := func(p *cluster.Peer, id uint64) {
		_ = p.SendMessage(context.Background(), &wire.Message{Target: "reply", Request: id})
	}
	nodes[1].r.hook.Store(&echo)
	var w wire.Waiter
	var got atomic.Uint64
	take := func(_ *cluster.Peer, id uint64) {
		k := w.Claim()
		got.Store(id)
		k.Notify()
	}
	nodes[0].r.hook.Store(&take)
	for i := uint64(1); i <= 200; i++ {
		if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: i}); err != nil {
			t.Fatal(err)
		}
		if p.Await(ctx, &w, func() bool { return got.Load() == i }) {
			t.Fatal("Await: the caller may not read a memnet connection")
		}
		if got.Load() != i {
			t.Fatalf("request %d: reply not received (last %d): %v", i, got.Load(), ctx.Err())
		}
	}
}

// TestFaultNoDeliveryAfterDown: messages sent into a partition before the
// peer is declared down die with their connection, and the peer, declared
// down, refuses sends; after the heal only what is sent on the new
// connection arrives.
func TestFaultNoDeliveryAfterDown(t *testing.T) {
	nw := memnet.New(5)
	cfg := memConfig(t, 2, fastHeartbeat, fastFailure)
	nodes := startNodes(t, nw, cfg)
	awaitUpEverywhere(t, nodes)
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	old, err := nodes[0].m.WaitUp(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := old.SendMessage(ctx, &wire.Message{Target: "x", Request: 1}); err != nil {
		t.Fatal(err)
	}
	nodes[1].r.awaitMessage(t, 1)

	nw.Partition([]string{"node0"}, []string{"node1"})
	// Sent into the stalled connection: buffered, never read.
	for id := uint64(2); id <= 4; id++ {
		_ = old.SendMessage(ctx, &wire.Message{Target: "x", Request: id})
	}
	for i, n := range nodes {
		n.r.await(t, false, cfg.Nodes[1-i].Name)
	}
	if _, ok := nodes[0].m.Peer("node1"); ok {
		t.Fatal("node1 still up at node0 after its NodeDown")
	}
	// The old peer is dead: a send on it fails and reaches nobody.
	if err := old.SendMessage(ctx, &wire.Message{Target: "x", Request: 5}); err == nil {
		t.Fatal("send to a peer declared down succeeded")
	}

	nw.Heal()
	for i, n := range nodes {
		n.r.await(t, true, cfg.Nodes[1-i].Name)
	}
	p, err := nodes[0].m.WaitUp(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: 6}); err != nil {
		t.Fatal(err)
	}
	nodes[1].r.awaitMessage(t, 6)
	if got := nodes[1].r.received(); !slices.Equal(got, []uint64{1, 6}) {
		t.Fatalf("node1 received %v, want [1 6]: a message outlived the connection declared down", got)
	}
}

// TestFaultSimultaneousDialsRandomDelays: two nodes start at once and dial
// each other over a link whose writes are delayed at random, so the two
// handshakes interleave differently with each seed; whichever connection
// the tie-break keeps, a message each node sends as soon as WaitUp returns
// arrives.
func TestFaultSimultaneousDialsRandomDelays(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			nw := memnet.New(seed)
			nw.Delay("node0", "node1", 0, 2*time.Millisecond)
			cfg := memConfig(t, 2, slowHeartbeat, slowFailure)
			nodes := startNodes(t, nw, cfg)
			ctx, cancel := context.WithTimeout(t.Context(), guard)
			defer cancel()
			for i, n := range nodes {
				p, err := n.m.WaitUp(ctx, cfg.Nodes[1-i].Name)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.SendMessage(ctx, &wire.Message{Target: "x", Request: uint64(i + 1)}); err != nil {
					t.Fatalf("send on a connection WaitUp returned: %v", err)
				}
			}
			for i, n := range nodes {
				n.r.awaitMessage(t, uint64(2-i))
			}
		})
	}
}
