// Package verbs is the RDMA data channel: the fetcher reads an exported
// tensor straight out of the owner's memory with one-sided RDMA READs over
// an RC queue pair, through internal/ibverbs (libibverbs opened at run
// time). Where no RDMA device can be used, New fails with an error wrapping
// rdma.ErrNotViable and the node runs the staging channel instead.
//
// Set-up runs over the authenticated control connection (rdma.Env.Control):
// the fetcher's first transfer from an owner creates a queue pair and sends
// its endpoint (QP number, PSN, GID or LID, MTU); the owner creates the
// matching queue pair in a protection domain of its own for that fetcher
// and answers with its endpoint. No rdma_cm is involved.
//
// Each transfer is a pull:
//
//  1. Offer (owner, while encoding the descriptor for one peer) registers
//     the export's bytes in that peer's protection domain with remote read
//     access only, and puts address, length and rkey in the descriptor.
//  2. Fetch (fetcher) asks the owner to begin a read: the owner checks the
//     lease, which must have been issued to that peer, and keeps the export
//     lent until the read ends.
//  3. The fetcher registers its destination's whole allocation in the
//     connection's protection domain through a memory.RegCache ("verbs":
//     keyed by allocation and connection, LRU-evicted under
//     Config.CacheBytes and CacheEntries, dropped when the allocation is
//     freed and with its peer) and posts RDMA READs of ChunkSize bytes,
//     Window outstanding, then tells the owner the read is over.
//
// The owner side does not cache: it registers per export and deregisters
// an export's region when the export ends and no read is in progress, so a
// released export's rkey reads nothing; an rkey is
// useless to any other peer, whose queue pair lives in another protection
// domain. Work completion errors, queue pair errors and a dead owner fail
// the transfer with an error (rdma.ErrPeerDown when the owner stopped
// answering); PeerDown and Close tear down queue pairs and registrations.
//
// The channel opens one RDMA device, the one nearest the GPU it serves
// (Config.GPU, by default CUDA device 0 of the process): internal/pcitopo
// ranks the host's NICs by PCIe/NUMA distance class from that GPU (PIX, PXB,
// PHB, NODE, SYS, as `nvidia-smi topo -m` prints them) and the first NIC
// with a usable port in that order is taken, so a NIC of the nearest class
// unless none has one; a NIC across sockets, or a farther one taken for
// want of a usable port, is logged as a warning. Config.Device overrides the
// choice; `ferry topo` prints it for each GPU.
//
// Usage, next to the other channels of a node:
//
//	ch, err := verbs.New(env) // env.Store, env.Control set by the node
//	if errors.Is(err, rdma.ErrNotViable) {
//		// report err as the reason and use staging
//	}
//	offer, err := ch.Offer(ctx, export, peer)  // owner
//	err = ch.Fetch(ctx, desc, dst)             // fetcher
//
// GPU memory is registered through a dmabuf fd when the buffer implements
// DmabufExporter and libibverbs has ibv_reg_dmabuf_mr, else by pointer
// (nvidia-peermem).
package verbs
