// Package rdma is tensorferry's data plane: the Channel interface that moves
// exported tensors between nodes, the registry of channel backends, the
// capabilities each node advertises (Caps), and Select, the pure function
// that picks a channel for a pair of devices with a reason for every channel
// it rejects.
//
// Channels live in subpackages: local (same process), ipc (same host, CUDA
// IPC), staging (pinned host ring over TCP) and verbs (ibverbs, GPUDirect
// RDMA); importing rdma/builtin registers all four. rdmatest is the
// conformance suite every channel passes.
//
//	choice := rdma.Select(ownerCaps, myCaps, memory.CUDA(0), memory.CUDA(1))
//	fmt.Println(choice.Channel) // "ipc"
//	for _, r := range choice.Rejected {
//		fmt.Println(r.Channel, r.Reason)
//	}
//
// # The registry
//
// Each channel package registers a Backend in an init function: its name
// and priority, whether it can run on this machine (Viable) and what it
// advertises there (Advertise, into Caps.Ads under its name), which pairs
// of ends and devices it serves (Scope, Reach: pure functions of the two
// ends' Caps), whether it serves an export only to its lease's holder
// (HolderBound), and its constructor (New). Nothing else names a channel:
// a node builds its Caps with LocalCaps (the registered backends that are
// viable and not disabled), starts them with Open, and picks one per
// transfer with Select; `ferry topo` prints the same choices.
//
// # Adding a channel
//
// Write a package with the Channel (and, if it needs them, ConnServer for
// data connections or ControlHandler for set-up requests over
// Env.Control), pass the rdmatest suite, and register its backend in a
// backend.go file:
//
//	func init() {
//		rdma.MustRegister(rdma.Backend{
//			Name:     "shm",
//			Priority: 15, // after local, before ipc
//			Viable:   available,
//			Scope:    sameHost,
//			Reach:    func(o, f *rdma.Caps, src, dst memory.Device) error { return nil },
//			New:      func(env *rdma.Env) (rdma.Channel, error) { return New(env) },
//		})
//	}
//
// Then import the package for its registration where the node is built
// (`import _ ".../shm"`), or add it to rdma/builtin so that every node
// runs it. A config may disable it by name like the built-in ones.
package rdma
