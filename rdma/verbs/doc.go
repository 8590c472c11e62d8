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
//  1. Offer (owner, while encoding the descriptor for one peer) prepares the
//     export for that peer and puts its address and length in the
//     descriptor (see "Grants" below).
//  2. Fetch (fetcher) connects to the owner if it has not, then asks it to
//     begin a read: the owner checks the lease, which must have been issued
//     to that peer, keeps the export lent until the read ends and answers
//     with the rkey that reads it through this connection.
//  3. The fetcher registers its destination's whole allocation in the
//     connection's protection domain through a memory.RegCache ("verbs":
//     keyed by allocation and connection, LRU-evicted under
//     Config.CacheBytes and CacheEntries, dropped when the allocation is
//     freed and with its peer) and posts RDMA READs of ChunkSize bytes,
//     Window outstanding, then tells the owner the read is over.
//
// Several NICs: besides rail 0 (the device chosen as below) the channel
// opens the other usable RDMA devices of rail 0's distance class from the
// GPU (every usable device without a GPU; none with Config.Device set), up
// to Config.Rails, and splits a transfer
// of n bytes into min(rails, n / Config.RailMinBytes) slices read
// concurrently, slice i over rail i: a queue pair, protection domain and
// registrations of its own between the fetcher's device i and the owner's
// device i (rail-optimized fabrics wire NIC i of every host to the same
// switch). A slice whose rail fails (a work request fails, the connection
// breaks, the owner has no such rail) is read again over the other rails;
// when all fail, or the failure is one no rail can mend (the lease, the
// size, the owner gone), the transfer fails with the error that explains
// it best and no read still writes the destination.
//
// Grants (Config.Grants, Channel.Grants, GrantsOf for tools such as `ferry
// topo`): with memory windows the owner registers each allocation once per
// peer protection domain, for window binding only (its own rkey reads
// nothing), in a memory.RegCache per memory device ("verbs-owner", budget
// Config.OwnerBudget: RLIMIT_MEMLOCK for host memory, free BAR1 for a GPU;
// LRU-evicted when idle, dropped when the allocation is freed and with the
// peer), and grants each export through a type-2 memory window bound
// (IBV_WR_BIND_MW) to exactly the export's bytes on the peer's queue pair at
// its first read, invalidated (IBV_WR_LOCAL_INV) when the export ends and no
// read is in progress: a released export's rkey reads nothing while the
// registration stays for the next export of the allocation. Without type-2
// windows, or where ibverbs.ProbeWindows finds that the device does not
// confine reads to a window (soft-RoCE up to Linux 6.12 at least), the
// owner registers each export's bytes with remote read access and
// deregisters them when it ends, as GrantRegister does. Either way an rkey
// is useless to any other peer, whose queue pair lives in another
// protection domain. Work completion errors, queue pair errors and a dead
// owner fail the transfer with an error (rdma.ErrPeerDown when the owner
// stopped answering); PeerDown and Close tear down queue pairs, windows and
// registrations.
//
// Rail 0 is the RDMA device nearest the GPU the channel serves
// (Config.GPU, by default CUDA device 0 of the process): internal/pcitopo
// ranks the host's NICs by PCIe/NUMA distance class from that GPU (PIX, PXB,
// PHB, NODE, SYS, as `nvidia-smi topo -m` prints them) and the first NIC
// with a usable port in that order is taken, so a NIC of the nearest class
// unless none has one; a NIC across sockets, or a farther one taken for
// want of a usable port, is logged as a warning. Config.Device overrides the
// choice (and makes it the only rail); `ferry topo` prints it for each GPU.
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
