// Package rdma is tensorferry's data plane: the Channel interface that moves
// exported tensors between nodes, the capabilities each node advertises, and
// Select, the pure function that picks a channel for a pair of devices with a
// reason for every channel it rejects.
//
// Channels live in subpackages: local (same process), ipc (same host, CUDA
// IPC), staging (pinned host ring over TCP) and verbs (ibverbs, GPUDirect
// RDMA). rdmatest is the conformance suite every channel passes.
//
//	choice := rdma.Select(ownerCaps, myCaps, memory.CUDA(0), memory.CUDA(1))
//	fmt.Println(choice.Channel) // "ipc"
//	for _, r := range choice.Rejected {
//		fmt.Println(r.Channel, r.Reason)
//	}
package rdma
