// Package kernels holds the PTX source of tensorferry's float32 vector
// kernels, embedded in the binary and JIT-compiled by the CUDA driver for
// whatever GPU is present (sm_70 or newer). memory.Axpy, memory.Scale,
// memory.Add and memory.SGD load and launch them; see README.md for how the
// PTX was written and the CUDA C it corresponds to.
//
// Most code calls memory.Axpy and friends; loading the PTX directly looks
// like this (ctx is an internal/cuda *Context):
//
//	mod, err := ctx.ModuleLoadData(kernels.PTX)
//	f, err := mod.Function(kernels.Axpy)
package kernels
