package actor

import "github.com/tensorferry/tensorferry/shm"

// WithSharedMemory configures the transport of control connections between
// processes of one host (package shm): by default (the zero shm.Config) two
// nodes that find they run on one host move their control connection to
// rings in shared memory after the handshake, and stay on TCP otherwise.
// shm.Config{Disable: true}, or the config's transport.shared_memory set to
// false, keeps every connection on its socket; a zero Spin takes the
// config's transport.read_spin.
func WithSharedMemory(c shm.Config) Option { return func(o *options) { o.shm = c } }

// PeerTransport names what the control connection to the named node runs
// over: "shm" (shared memory), "tls", or the network of its remote address
// ("tcp"; a test network's name); "" when the node is not up.
func (n *Node) PeerTransport(node string) string {
	if n.members == nil {
		return ""
	}
	if p, ok := n.members.Peer(node); ok {
		return p.Transport()
	}
	return ""
}
