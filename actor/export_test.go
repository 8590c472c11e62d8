package actor

import "github.com/tensorferry/tensorferry/wire"

// SetLazyDecode turns the decode of bursts by the actor's goroutine on or
// off for n (by default as transport.burst_decode says).
func SetLazyDecode(n *Node, on bool) { n.lazyDecode.Store(on) }

// InlineActors returns how many actors of n have inline delivery.
func InlineActors(n *Node) int64 { return n.onReader.count.Load() }

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

// ReceiveAlone has n handle m as if the peer named peer had sent it alone
// in a frame.
func ReceiveAlone(n *Node, peer string, m *wire.Message) {
	n.receiveMessage(n.peer(peer), m, nil)
}

// EncodeFor fills m's type, serializer and body with msg's encoding, and
// its tensor table with what n exports of the tensors of lends (nil:
// none) for peer.
func EncodeFor(n *Node, peer string, m *wire.Message, msg, lends any) error {
	var err error
	if m.Type, m.Ser, m.Body, err = registry.AppendEncode(nil, msg); err != nil {
		return err
	}
	if lends != nil {
		out, err := n.eng.Export(peer, lends)
		if err != nil {
			return err
		}
		m.Tensors = out.Table
	}
	return nil
}
