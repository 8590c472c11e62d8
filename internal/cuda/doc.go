// Package cuda is the only door to the CUDA driver API. It opens
// libcuda.so.1 with dlopen at first use (no CUDA headers or libraries are
// needed to build), resolves every symbol it uses from one table, and wraps
// each driver call in a Go function that returns nil on success or an *Error
// naming the call and the driver's error name:
//
//	cuda: cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE
//
// Without a driver every function returns an error matching ErrNoDriver and
// ErrNoDevice (errors.Is), and with a driver but no GPU one matching
// ErrNoDevice, so callers can treat CUDA as "not viable" instead of failing.
// Builds without cgo or for other systems than Linux compile a version whose
// every function returns such an error.
//
// Context binding: the driver keeps the current context per OS thread, and a
// goroutine may change threads between two cgo calls. Every call that needs a
// context therefore runs a small C shim that makes the Context current and
// calls the driver inside one cgo call, on one thread. Methods that need a
// context hang off *Context, the retained primary context of one device.
//
// Host memory and cgo: host pointers are handed to the driver as
// unsafe.Pointer for the duration of one call. Synchronous copies may use Go
// memory. Asynchronous copies keep using the host memory after the call
// returns, so their host side must be C memory (MemHostAlloc) or memory
// registered with MemHostRegister that the caller keeps alive until the
// stream has been synchronized.
//
// Usage:
//
//	if err := cuda.Init(); err != nil {
//		if errors.Is(err, cuda.ErrNoDevice) {
//			return // no GPU here: fall back to the CPU
//		}
//		return err
//	}
//	ctx, _ := cuda.Primary(0)
//	p, _ := ctx.MemAlloc(1 << 20)
//	defer ctx.MemFree(p)
//	_ = ctx.MemcpyHtoD(p, unsafe.Pointer(&host[0]), len(host))
package cuda
