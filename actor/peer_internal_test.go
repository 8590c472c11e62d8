package actor

import (
	"fmt"
	"hash/maphash"
	"sync"
	"testing"

	pa "github.com/asynkron/protoactor-go/actor"
)

// TestTargetCache: a repeated id gets the cached PID, a future's id is
// never cached, any number of distinct ids keeps at most targetSlots
// PIDs, and two readers (a reader and the one that took over from it) may
// use it at once.
func TestTargetCache(t *testing.T) {
	var tc routeCache
	a := tc.target("self", "worker")
	if a.Address != "self" || a.Id != "worker" {
		t.Fatalf("got %v", a)
	}
	if b := tc.target("self", "worker"); b != a {
		t.Fatal("a repeated id was not served from the cache")
	}
	if f1, f2 := tc.target("self", "future$1"), tc.target("self", "future$1"); f1 == f2 {
		t.Fatal("a future was cached")
	}
	for i := range 10 * targetSlots {
		if p := tc.target("self", fmt.Sprintf("actor-%d", i)); p.Id != fmt.Sprintf("actor-%d", i) {
			t.Fatalf("id %d: got %v", i, p)
		}
	}
	cached := 0
	for i := range tc.targets {
		if tc.targets[i].Load() != nil {
			cached++
		}
	}
	if cached > targetSlots {
		t.Fatalf("%d PIDs cached", cached)
	}
	// Two ids of one slot pair both stay cached.
	var tc2 routeCache
	pair := func(id string) uint64 { return maphash.String(targetSeed, id) & (targetSlots - 1) >> 1 }
	x, y := "x", ""
	for i := 0; y == ""; i++ {
		if id := fmt.Sprintf("y-%d", i); pair(id) == pair(x) {
			y = id
		}
	}
	px, py := tc2.target("self", x), tc2.target("self", y)
	if tc2.target("self", x) != px || tc2.target("self", y) != py {
		t.Fatal("two ids of one slot pair evicted each other")
	}
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			for i := range 20000 {
				id := fmt.Sprintf("hot-%d", (i+r)%8)
				if p := tc.target("self", id); p.Id != id || p.Address != "self" {
					t.Errorf("got %v for %s", p, id)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestRemovePendingAfterPeerDown: a request whose send fails gives its
// future a failure only while it is still pending; once PeerDown has taken
// it (and failed it), removePending says so, and the send's failure must
// not give it a second result (protoactor's future takes one, unguarded).
func TestRemovePendingAfterPeerDown(t *testing.T) {
	ps := &peerState{pending: map[string]*pa.PID{}}
	f := pa.NewPID("self", "future$1")
	ps.addPending(f)
	if !ps.removePending(f) {
		t.Fatal("a pending future was not reported removed")
	}
	if ps.removePending(f) {
		t.Fatal("a future removed twice was reported removed twice")
	}
	ps.addPending(f)
	if taken := ps.takePending(&failedFutures{}); taken[f.Id] != f {
		t.Fatalf("PeerDown took %v", taken)
	}
	if ps.removePending(f) {
		t.Fatal("a future PeerDown took is still reported pending: it would get a second result")
	}
	if ps.removePending(nil) {
		t.Fatal("nil reported pending")
	}
}

// claimNode is a Node with peers b and c, enough for claimFuture.
func claimNode() (n *Node, b, c *peerState) {
	n = &Node{peers: map[string]*peerState{}}
	b = &peerState{pending: map[string]*pa.PID{}}
	c = &peerState{pending: map[string]*pa.PID{}}
	n.peers["b"], n.peers["c"] = b, c
	n.publishPeers()
	return n, b, c
}

// TestClaimFuture: a reply claims its future from whichever peer it waits
// on (a request forwarded to a third node is answered by that node), so
// PeerDown no longer fails it; once PeerDown took a future to fail it, no
// reply, from any peer, claims it; a future that waits on no peer takes its
// reply; and what PeerDown failed is remembered for the last
// failedFutureMemory futures only.
func TestClaimFuture(t *testing.T) {
	n, b, c := claimNode()
	fwd := pa.NewPID("self", "future$forwarded")
	b.addPending(fwd)
	if !n.claimFuture(c, fwd) {
		t.Fatal("a reply from the node a request was forwarded to was refused")
	}
	failed := pa.NewPID("self", "future$failed")
	b.addPending(failed)
	if taken := b.takePending(&n.failedFutures); len(taken) != 1 || taken[failed.Id] != failed {
		t.Fatalf("PeerDown took %v, want only the future still waiting", taken)
	}
	for _, from := range []*peerState{b, c, b} {
		if n.claimFuture(from, failed) {
			t.Fatal("a reply claimed a future PeerDown had taken to fail it")
		}
	}
	if !n.claimFuture(c, pa.NewPID("self", "future$unknown")) {
		t.Fatal("a future that waits on no peer was refused its reply")
	}
	many := map[string]*pa.PID{}
	for i := range failedFutureMemory + 10 {
		id := fmt.Sprintf("future$%d", i)
		many[id] = pa.NewPID("self", id)
	}
	n.failedFutures.add(many)
	if got := len(n.failedFutures.ids); got != failedFutureMemory {
		t.Fatalf("%d failed futures remembered, want %d", got, failedFutureMemory)
	}
}

// TestClaimFutureRacesPeerDown: replies and PeerDown race for the same
// futures; each future gets exactly one result, from one or the other.
func TestClaimFutureRacesPeerDown(t *testing.T) {
	n, b, c := claimNode()
	const count = 2000
	fs := make([]*pa.PID, count)
	for i := range fs {
		fs[i] = pa.NewPID("self", fmt.Sprintf("future$race-%d", i))
		b.addPending(fs[i])
	}
	claimed := make([]bool, count)
	var taken map[string]*pa.PID
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, f := range fs {
			from := c
			if i%2 == 0 {
				from = b
			}
			claimed[i] = n.claimFuture(from, f)
		}
	})
	wg.Go(func() { taken = b.takePending(&n.failedFutures) })
	wg.Wait()
	for i, f := range fs {
		_, failed := taken[f.Id]
		if claimed[i] == failed {
			t.Fatalf("future %d: claimed by a reply %v, failed by PeerDown %v: want exactly one", i, claimed[i], failed)
		}
	}
}
