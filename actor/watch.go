package actor

import (
	"fmt"

	pa "github.com/asynkron/protoactor-go/actor"
)

// MaxWatchesPerPeer bounds the watches one peer's actors hold on this
// node's actors; a Watch beyond it is refused (its watcher gets a
// *DeliveryFailed naming the reason).
const MaxWatchesPerPeer = 1 << 16

// watchers records, per peer, which local actors that peer's actors watch:
// bounded per peer, and dropped (each watched actor told Unwatch) when the
// peer goes down, so a peer's watches never outlive it.
type watchers struct {
	byPeer map[string]map[string]map[string]struct{} // peer → local actor id → watcher ids
	count  map[string]int                            // peer → watches
}

// addWatcher records that watcher watcherID of the peer watches local
// actor id; it refuses a watcher claimed for another node and watches
// beyond MaxWatchesPerPeer.
func (n *Node) addWatcher(ps *peerState, id, watcherNode, watcherID string) error {
	peer := ps.peer.Name
	if watcherNode != peer {
		return fmt.Errorf("actor: %s sent a watch for a watcher of %q", peer, watcherNode)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	w := &n.remoteWatchers
	if w.byPeer == nil {
		w.byPeer, w.count = map[string]map[string]map[string]struct{}{}, map[string]int{}
	}
	if n.peers[peer] != ps {
		return fmt.Errorf("actor: %s is down", peer)
	}
	ids := w.byPeer[peer]
	if ids == nil {
		ids = map[string]map[string]struct{}{}
		w.byPeer[peer] = ids
	}
	set := ids[id]
	if _, dup := set[watcherID]; dup {
		return nil
	}
	if w.count[peer] >= MaxWatchesPerPeer {
		return fmt.Errorf("actor: %s holds %d watches on %s already (MaxWatchesPerPeer)", peer, w.count[peer], n.self.Name)
	}
	if set == nil {
		set = map[string]struct{}{}
		ids[id] = set
	}
	set[watcherID] = struct{}{}
	w.count[peer]++
	return nil
}

// removeWatcher forgets one watch of a peer's watcher on local actor id.
func (n *Node) removeWatcher(peer, id, watcherID string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w := &n.remoteWatchers
	set := w.byPeer[peer][id]
	if _, ok := set[watcherID]; !ok {
		return
	}
	delete(set, watcherID)
	w.count[peer]--
	if len(set) == 0 {
		delete(w.byPeer[peer], id)
	}
}

// dropWatchers tells every local actor watched by a peer that went down
// that its watchers there are gone (Unwatch), and forgets them.
func (n *Node) dropWatchers(peer string) {
	n.mu.Lock()
	ids := n.remoteWatchers.byPeer[peer]
	delete(n.remoteWatchers.byPeer, peer)
	delete(n.remoteWatchers.count, peer)
	n.mu.Unlock()
	for id, set := range ids {
		proc, ok := n.system.ProcessRegistry.GetLocal(id)
		if !ok {
			continue
		}
		local := pa.NewPID(n.self.Name, id)
		for w := range set {
			proc.SendSystemMessage(local, &pa.Unwatch{Watcher: pa.NewPID(peer, w)})
		}
	}
}

// remoteWatches returns how many watches the named peer holds here.
func (n *Node) remoteWatches(peer string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.remoteWatchers.count[peer]
}

// addWatch records that a local watcher watches a remote actor, so that the
// watcher gets Terminated if the actor's node goes down. It returns false
// when that node is not up.
func (n *Node) addWatch(watchee, watcher *pa.PID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, up := n.peers[watchee.Address]; !up {
		return false
	}
	byID := n.watching[watchee.Address]
	if byID == nil {
		byID = map[string]map[string]*pa.PID{}
		n.watching[watchee.Address] = byID
	}
	ws := byID[watchee.Id]
	if ws == nil {
		ws = map[string]*pa.PID{}
		byID[watchee.Id] = ws
	}
	ws[watcher.Id] = watcher
	return true
}

func (n *Node) removeWatch(watchee, watcher *pa.PID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ws := n.watching[watchee.Address][watchee.Id]
	delete(ws, watcher.Id)
	if len(ws) == 0 {
		delete(n.watching[watchee.Address], watchee.Id)
	}
}

// sweepFutures forgets pending requests whose futures no longer exist
// (completed or timed out).
func (n *Node) sweepFutures() {
	n.mu.Lock()
	peers := make([]*peerState, 0, len(n.peers))
	for _, ps := range n.peers {
		peers = append(peers, ps)
	}
	n.mu.Unlock()
	for _, ps := range peers {
		ps.mu.Lock()
		for id := range ps.pending {
			if _, ok := n.system.ProcessRegistry.GetLocal(id); !ok {
				delete(ps.pending, id)
			}
		}
		ps.mu.Unlock()
	}
}

// watchCount returns how many remote watches are recorded (tests).
func (n *Node) watchCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, byID := range n.watching {
		for _, ws := range byID {
			c += len(ws)
		}
	}
	return c
}
