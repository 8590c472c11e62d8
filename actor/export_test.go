package actor

// SetLazyDecode turns the decode of bursts by the actor's goroutine on or
// off for n (by default as transport.burst_decode says).
func SetLazyDecode(n *Node, on bool) { n.lazyDecode.Store(on) }

// InlineActors returns how many actors of n have inline delivery.
func InlineActors(n *Node) int64 { return n.inline.count.Load() }

// WaitingRequests returns how many Request calls of n wait for a reply.
func WaitingRequests(n *Node) int {
	n.replies.mu.Lock()
	defer n.replies.mu.Unlock()
	return len(n.replies.m)
}

// RemoteWatches returns how many watches the named peer's actors hold on
// n's actors.
func RemoteWatches(n *Node, peer string) int { return n.remoteWatches(peer) }

// WatchCount returns how many watches n's actors hold on other nodes'
// actors.
func WatchCount(n *Node) int { return n.watchCount() }

// LazyDecode reports whether n decodes bursts on the actor's goroutine.
func LazyDecode(n *Node) bool { return n.lazyDecode.Load() }
