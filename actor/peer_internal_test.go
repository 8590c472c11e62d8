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
	var tc targetCache
	a := tc.get("self", "worker")
	if a.Address != "self" || a.Id != "worker" {
		t.Fatalf("got %v", a)
	}
	if b := tc.get("self", "worker"); b != a {
		t.Fatal("a repeated id was not served from the cache")
	}
	if f1, f2 := tc.get("self", "future$1"), tc.get("self", "future$1"); f1 == f2 {
		t.Fatal("a future was cached")
	}
	for i := range 10 * targetSlots {
		if p := tc.get("self", fmt.Sprintf("actor-%d", i)); p.Id != fmt.Sprintf("actor-%d", i) {
			t.Fatalf("id %d: got %v", i, p)
		}
	}
	cached := 0
	for i := range tc.slots {
		if tc.slots[i].Load() != nil {
			cached++
		}
	}
	if cached > targetSlots {
		t.Fatalf("%d PIDs cached", cached)
	}
	// Two ids of one slot pair both stay cached.
	var tc2 targetCache
	pair := func(id string) uint64 { return maphash.String(targetSeed, id) & (targetSlots - 1) >> 1 }
	x, y := "x", ""
	for i := 0; y == ""; i++ {
		if id := fmt.Sprintf("y-%d", i); pair(id) == pair(x) {
			y = id
		}
	}
	px, py := tc2.get("self", x), tc2.get("self", y)
	if tc2.get("self", x) != px || tc2.get("self", y) != py {
		t.Fatal("two ids of one slot pair evicted each other")
	}
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			for i := range 20000 {
				id := fmt.Sprintf("hot-%d", (i+r)%8)
				if p := tc.get("self", id); p.Id != id || p.Address != "self" {
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
	if taken := ps.takePending(); taken[f.Id] != f {
		t.Fatalf("PeerDown took %v", taken)
	}
	if ps.removePending(f) {
		t.Fatal("a future PeerDown took is still reported pending: it would get a second result")
	}
	if ps.removePending(nil) {
		t.Fatal("nil reported pending")
	}
}
