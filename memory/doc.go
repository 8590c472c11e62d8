// Package memory holds the buffers tensors live in and the devices they live
// on, and everything the data channels need of them:
//
//   - Buffers and allocators (buffer.go, allocators.go, host.go, pinned.go,
//     cuda.go): host memory (aligned, a real backend), pinned host memory
//     and CUDA device memory (through internal/cuda, when a driver is
//     present; AllocatorFor fails with ErrNotSupported otherwise), with a
//     cache of freed blocks per device.
//   - Copies (Copy; cuda_copy.go) between any two buffers, and Streams and
//     Events (stream.go) for the pipelined copies of the staging channel.
//   - CUDA IPC (cuda_ipc.go): ExportIPC and OpenIPC of whole allocations,
//     DmaBuf for RDMA registration of GPU memory.
//   - Topology (topology.go): this host's id and its GPUs with the NVML P2P
//     matrix, from which channel selection works.
//   - The registration cache (regcache.go, regcache_host.go): pinning and
//     registering whole allocations once, keeping them after the transfer
//     (lazy unpinning), evicting under a budget, invalidating when the
//     allocation is freed (OnFree); hit, miss and eviction counters;
//     PinBudget (regcache_budget*.go), the default budget of NIC
//     registrations: RLIMIT_MEMLOCK for host memory, free BAR1 for a GPU.
//   - Checksum (CRC-32C of a buffer, device memory through a host staging
//     buffer) for the lend check, and vector kernels (cuda_kernels.go)
//     used by the parameter-server sample.
//
// Everything above this package sees Go types, never raw driver calls.
//
//	dev, _ := memory.ParseDevice("cpu")
//	a, _ := memory.AllocatorFor(dev)
//	buf, _ := a.Alloc(1 << 20)
//	defer buf.Free()
//	copy(buf.Host(), data)
//	_ = memory.Copy(ctx, gpuBuf, buf) // host to device, with a GPU
package memory
