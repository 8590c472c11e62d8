// Package memory holds the buffers tensors live in and the devices they live
// on, and everything the data channels and programs need of them. It is the
// only package that talks to the CUDA driver (through internal/cuda);
// everything above it sees Go types, never raw driver calls. Without a
// driver or a GPU every CUDA entry point fails with an error matching
// ErrNotSupported that carries the driver's reason.
//
//   - Devices (device.go): Device is "cpu" (KindHost), "pinned"
//     (KindPinned: page-locked host memory) or "cuda:N" (KindCUDA);
//     ParseDevice reads them from flags and YAML.
//   - Buffers and allocators (buffer.go, allocators.go, host.go,
//     host_cache.go, pinned.go, cuda.go): Buffer is a contiguous range on
//     one device; Slice makes views that share its Allocation. Host memory
//     is 64-byte aligned Go memory with a cache of freed blocks; pinned
//     memory comes from cuMemHostAlloc; CUDAAllocator is a caching allocator
//     per device (SetCacheBytes bounds its cache); WrapHost and WrapCUDA adopt memory
//     allocated elsewhere. OnFree (freehooks.go) tells caches keyed by
//     Allocation.ID that an allocation went away.
//   - Copies and fills (Copy, buffer.go and cuda_copy.go; Fill, fill.go)
//     between and on any buffers, complete when they return, in chunks
//     between which the context is checked.
//   - Streams and events (stream.go): a Stream is an ordered queue of copies
//     and kernels on one device (CopyAsync, Function.Launch); Events order
//     work across streams (Record, Wait) and tell the host when it is done
//     (Synchronize, Query). Timing events (NewTimingEvent) also give the
//     device time between two of them (ElapsedTime).
//   - Kernels (module.go, ptx.go): LoadModule loads PTX (JIT-compiled for the
//     device) or a cubin; Module.Function finds a kernel; Function.Launch
//     enqueues it on a Stream and Function.Run runs it and waits, with
//     typed arguments (BufferArg, Float32Arg, Uint64Arg, ...) that are
//     checked against the PTX entry's parameter list. Programs ship their
//     own kernels (samples/paramserver/ps does).
//   - Peers (cuda_copy.go): CanAccessPeer and EnablePeerAccess for P2P
//     between two GPUs; copies between GPUs work without it too (the driver
//     stages them through the host).
//   - CUDA IPC (cuda_ipc.go): ExportIPC and OpenIPC of whole allocations
//     between processes of one host, DmaBuf for RDMA registration of GPU
//     memory.
//   - Topology (topology.go, cuda_info.go): HostID (equal for the processes
//     of one host), Topology (this host's GPUs and the NVML P2P matrix,
//     from which channels are selected), and the CUDA device count,
//     identity and memory.
//   - NUMA placement (numa_linux.go): PinnedAllocator.AllocOnNode places
//     pinned memory on a NUMA node (mbind before first touch, then
//     cuMemHostRegister), DeviceNUMANode gives a GPU's node, PageNodes
//     where pages are.
//   - The registration cache (regcache.go, regcache_host.go): pinning and
//     registering whole allocations once and keeping them after the
//     transfer (lazy unpinning), evicting under a budget, invalidating when
//     the allocation is freed; hit, miss and eviction counters. PinBudget
//     (regcache_budget*.go) is the default budget of NIC registrations:
//     RLIMIT_MEMLOCK for host memory, free BAR1 for a GPU.
//   - Checksum (checksum.go): CRC-32C of a buffer, device memory through a
//     host staging buffer, for the lend check.
//
// Usage:
//
//	dev, _ := memory.ParseDevice("cuda:0")
//	a, err := memory.AllocatorFor(dev) // ErrNotSupported without a GPU
//	buf, _ := a.Alloc(1 << 20)
//	defer buf.Free()
//	_ = memory.Copy(ctx, buf, memory.WrapHost(data)) // host to device
//
//	mod, _ := memory.LoadModule(dev, ptx) // once per device
//	scale, _ := mod.Function("scale")
//	_ = scale.Run(ctx, memory.Linear(n, 0, 0),
//		memory.BufferArg(buf), memory.Float32Arg(2), memory.Uint64Arg(uint64(n)))
package memory
