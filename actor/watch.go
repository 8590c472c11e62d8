package actor

import (
	pa "github.com/asynkron/protoactor-go/actor"
)

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
