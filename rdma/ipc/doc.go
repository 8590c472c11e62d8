// Package ipc is the data channel between processes of one host: the
// fetcher maps the owner's CUDA allocation with CUDA IPC and copies from it
// with cuMemcpyDtoDAsync on its own stream, over NVLink or PCIe.
//
//	ch, err := ipc.New(env) // errors.Is(err, rdma.ErrNotViable) without CUDA
//	// owner, while encoding a descriptor for peer:
//	d.Offers[rdma.IPC], err = ch.Offer(ctx, export, peer)
//	// fetcher, with dst on one of its GPUs:
//	err = ch.Fetch(ctx, d, dst)
//	// then the caller releases the lease.
//	// or the other way (rdma.Putter), src on one of its GPUs, into an
//	// export the owner lent this node so that it writes it:
//	err = ch.PutStream(ctx, d, src, rdma.Progress{})
//
// # Protocol
//
// The offer in a descriptor only says where the tensor lies in its
// allocation (allocation id, offset, size); it grants nothing, so a
// forwarded descriptor gives its reader nothing. Everything else goes over
// rdma.Env.Control, from the fetcher's channel to the owner's
// (HandleControl):
//
//   - begin: the owner acquires the export (tensor.Store.Acquire: lease,
//     incarnation), checks that the caller is the export's holder and that
//     the allocation, offset and size match the export, and keeps the tensor
//     lent until end. On the first fetch of an allocation the fetcher asks
//     for the allocation's IPC handle (cuIpcGetMemHandle of the whole
//     allocation, made once per allocation and cached until the allocation
//     is freed, see memory.OnFree). The handle is given only to a node that
//     has proven it runs on the owner's host.
//   - challenge / prove: the same-host proof, once per peer. The owner
//     writes 32 random bytes into a fresh file of /dev/shm (mode 0600,
//     random name, exclusive create) and sends its path; the fetcher reads
//     it and answers HMAC-SHA256(token, its node name). Only a process that
//     shares the owner's /dev/shm can; the file is deleted at once. Both
//     nodes are already authenticated by the control connection.
//   - end: the owner releases the acquisition.
//   - revoke (owner to fetcher): the owner freed allocations whose handle it
//     gave the fetcher; the fetcher closes its mappings of them. Sent in the
//     background when the allocation is freed; an undelivered list waits
//     for the fetcher's next begin reply.
//
// Direct offers: once a holder has the handle of an allocation (it proved
// it shares the host and opened the allocation in an earlier begin), the
// owner's later offers of tensors in that allocation to that holder are
// direct: they carry the lease's deadline on the host's CLOCK_MONOTONIC,
// the same clock in every process of the host. The holder then copies
// under the lease alone, with no begin and no end: the lease keeps the
// tensor on the owner (tensor.Tensor.Free fails while it is lent) until it
// is released or its deadline passes. The copy must end before the
// deadline: a holder with less than Config.DirectMargin left begins
// instead (an acquisition outlives the lease), the copy's context ends a
// millisecond before the deadline, and a copy observed complete only after
// it is an error (errLeaseOutlived), since the owner may have reused the
// memory. A forwarded descriptor (the fetcher is not its holder) and a
// fetcher without an open mapping begin as before. Config.NoDirect turns
// direct offers off.
//
// The fetcher opens each handle once per (owner, owner incarnation,
// allocation, destination device) with lazy peer access and caches the
// mapping; mappings are closed when the owner frees the allocation (revoke),
// when more than
// Config.MaxMappings are open (least recently used idle ones), on PeerDown
// of the owner and on Close. A fetcher in the owner's own process (which
// CUDA does not let open its own handles) addresses the allocation
// directly.
//
// What a handle exposes: CUDA IPC maps a whole driver allocation, so a
// proven holder can read everything in it, for as long as it keeps the
// mapping (until the owner frees the allocation), not only the tensor it
// was lent, and write it too (CUDA IPC mappings are read-write; PutStream
// writes through them, under the same begin checks or direct offer as a
// fetch). Blocks of memory.CUDAAllocator hold one buffer at a time, but
// are reused for later tensors; tensors carved out of one allocation by
// the application share it. Handles go only to authenticated nodes of the
// cluster that proved they share the host.
//
// Cost per fetch: under a direct offer, the copy alone. Otherwise one
// control round trip (begin) and one end, not waited for, besides the copy;
// the first fetch of an allocation adds the handle open, the first fetch
// from an owner two more round trips (challenge, prove). Copies run in
// chunks (Config.CopyChunk, several queued at once) and are waited for by
// polling events, so a cancelled fetch returns after the chunks already
// queued finish, never while the device still uses the buffers.
package ipc
