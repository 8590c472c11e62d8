package memory

import (
	"fmt"
	"os"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// IPCHandle names a CUDA allocation for another process on the same host
// (CUDA IPC). It is plain bytes: send it over an authenticated connection
// only.
type IPCHandle struct {
	Handle [64]byte // cuIpcMemHandle of the whole driver allocation
	Size   int      // bytes of that allocation
}

// ExportIPC returns the IPC handle of the driver allocation that contains
// buf and buf's offset in it. The handle stays valid while that allocation
// lives: for buffers of the CUDA allocator, until the block leaves the cache
// (OnFree), not merely until buf.Free.
func ExportIPC(buf Buffer) (h IPCHandle, offset int, err error) {
	if buf.Device().Kind != KindCUDA {
		return IPCHandle{}, 0, fmt.Errorf("memory: ExportIPC: %s memory is not CUDA memory", buf.Device())
	}
	d, err := cudaDeviceFor(buf.Device())
	if err != nil {
		return IPCHandle{}, 0, err
	}
	p, err := devicePtr(buf)
	if err != nil {
		return IPCHandle{}, 0, err
	}
	base, size, err := d.ctx.MemGetAddressRange(p)
	if err != nil {
		return IPCHandle{}, 0, fmt.Errorf("memory: ExportIPC: %w", err)
	}
	raw, err := d.ctx.IpcGetMemHandle(base)
	if err != nil {
		return IPCHandle{}, 0, fmt.Errorf("memory: ExportIPC: %w", err)
	}
	return IPCHandle{Handle: raw, Size: size}, int(p - base), nil
}

// OpenIPC maps an allocation exported by another process of this host into
// dev and returns it as a Buffer of h.Size bytes (slice it at the exporter's
// offset). Free unmaps it. The driver maps a handle once per process and
// device: cache the Buffer (for example in a RegCache) rather than opening
// the same handle again. Peer access to the exporter's device is enabled
// lazily.
func OpenIPC(dev Device, h IPCHandle) (Buffer, error) {
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return nil, err
	}
	if h.Size <= 0 {
		return nil, fmt.Errorf("memory: OpenIPC: bad size %d", h.Size)
	}
	p, err := d.ctx.IpcOpenMemHandle(cuda.IpcMemHandle(h.Handle), cuda.IpcLazyEnablePeerAccess)
	if err != nil {
		return nil, fmt.Errorf("memory: OpenIPC on %s: %w", dev, err)
	}
	return WrapCUDA(dev, uintptr(p), h.Size, func() error {
		if err := d.ctx.IpcCloseMemHandle(p); err != nil {
			return fmt.Errorf("memory: close IPC mapping on %s: %w", dev, err)
		}
		return nil
	})
}

// DmaBuf exports the host-page-aligned range of device memory around buf
// as a dmabuf file descriptor, for ibv_reg_dmabuf_mr (GPUDirect RDMA). It
// returns the fd (the caller closes it), buf's offset in the exported range
// and the range's length. It fails when the device or driver lacks dmabuf
// support or the allocation is not page aligned (small allocations of the
// CUDA allocator may share pages: use buffers of 1 MiB or more).
func DmaBuf(buf Buffer) (fd, offset, length int, err error) {
	if buf.Device().Kind != KindCUDA {
		return -1, 0, 0, fmt.Errorf("memory: DmaBuf: %s memory is not CUDA memory", buf.Device())
	}
	d, err := cudaDeviceFor(buf.Device())
	if err != nil {
		return -1, 0, 0, err
	}
	if ok, err := cuda.DeviceGetAttribute(cuda.AttrDmaBufSupported, buf.Device().Index); err != nil || ok == 0 {
		return -1, 0, 0, fmt.Errorf("memory: DmaBuf: %s does not support dmabuf export (%v)", buf.Device(), err)
	}
	p, err := devicePtr(buf)
	if err != nil {
		return -1, 0, 0, err
	}
	base, size, err := d.ctx.MemGetAddressRange(p)
	if err != nil {
		return -1, 0, 0, fmt.Errorf("memory: DmaBuf: %w", err)
	}
	page := cuda.DevicePtr(os.Getpagesize())
	if base%page != 0 {
		return -1, 0, 0, fmt.Errorf("memory: DmaBuf: allocation at %#x is not page aligned", base)
	}
	length = int((cuda.DevicePtr(size) + page - 1) / page * page)
	fd, err = d.ctx.MemGetHandleForAddressRange(base, length)
	if err != nil {
		return -1, 0, 0, fmt.Errorf("memory: DmaBuf: %w", err)
	}
	return fd, int(p - base), length, nil
}
