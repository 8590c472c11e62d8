package memory

import (
	"fmt"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// HostRegistrar page-locks ordinary host allocations with cuMemHostRegister
// (portable: every device sees them as pinned), so that copies from and to
// them run at DMA speed; use it through a RegCache to pay the cost (about
// 12 ms for 256 MiB) once per allocation. Pinned allocations are already
// page-locked and get a registration that does nothing.
//
// The registered memory must stay allocated until it is unregistered; the
// RegCache does that when the buffer is freed (OnFree). Registration works
// on whole pages: two allocations sharing a page cannot both be registered
// (the driver reports CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), which is
// why staging registers large buffers, whose pages are their own.
type HostRegistrar struct {
	ctx *cuda.Context
}

// NewHostRegistrar returns a registrar, or an error matching ErrNotSupported
// (and the driver's reason) without a CUDA device.
func NewHostRegistrar() (*HostRegistrar, error) {
	ctx, err := cuda.Primary(0)
	if err != nil {
		return nil, notSupported(CPU, err)
	}
	return &HostRegistrar{ctx: ctx}, nil
}

// HostRegistration is a HostRegistrar's registration.
type HostRegistration struct {
	alloc  Allocation
	pinned bool // true when nothing was registered (already pinned, or empty)
}

// Allocation returns the registered allocation.
func (r *HostRegistration) Allocation() Allocation { return r.alloc }

// Register page-locks a host allocation (peer is ignored).
func (h *HostRegistrar) Register(a Allocation, _ string) (Registration, error) {
	switch {
	case a.Device.Kind == KindPinned || a.Size == 0:
		return &HostRegistration{alloc: a, pinned: true}, nil
	case a.Device.Kind != KindHost:
		return nil, fmt.Errorf("memory: host registrar: cannot register %s memory", a.Device)
	}
	if err := h.ctx.MemHostRegister(a.Base, a.Size, cuda.HostRegisterPortable); err != nil {
		return nil, fmt.Errorf("memory: host registrar: %w", err)
	}
	return &HostRegistration{alloc: a}, nil
}

// Unregister undoes Register.
func (h *HostRegistrar) Unregister(r Registration) error {
	hr, ok := r.(*HostRegistration)
	if !ok {
		return fmt.Errorf("memory: host registrar: foreign registration %T", r)
	}
	if hr.pinned {
		return nil
	}
	if err := h.ctx.MemHostUnregister(hr.alloc.Base); err != nil {
		return fmt.Errorf("memory: host registrar: %w", err)
	}
	return nil
}
