// Package memory holds the buffers tensors live in and the devices they live
// on: host memory (a real backend, aligned), pinned host memory and CUDA
// device memory (through internal/cuda, when a driver is present), copies
// between them, and the registration cache that keeps expensive pinning and
// registration work alive across transfers (lazy unpinning).
//
// Everything above this package sees Go types, never raw driver calls.
//
//	dev, _ := memory.ParseDevice("cpu")
//	a, _ := memory.AllocatorFor(dev)
//	buf, _ := a.Alloc(1 << 20)
//	defer buf.Free()
//	copy(buf.Host(), data)
package memory
