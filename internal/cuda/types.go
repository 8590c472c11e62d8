package cuda

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// IpcMemHandle is an opaque CUDA IPC memory handle (CUipcMemHandle): sent to
// another process on the same host, which opens it with IpcOpenMemHandle.
type IpcMemHandle [64]byte

// Flags of MemHostAlloc (CU_MEMHOSTALLOC_*).
const (
	HostAllocPortable      = 0x01 // pinned for every context, not only the current one
	HostAllocDeviceMap     = 0x02 // mapped into the device address space
	HostAllocWriteCombined = 0x04
)

// Flags of MemHostRegister (CU_MEMHOSTREGISTER_*).
const (
	HostRegisterPortable  = 0x01
	HostRegisterDeviceMap = 0x02
	HostRegisterReadOnly  = 0x08
)

// Flags of NewEvent (CU_EVENT_*).
const (
	EventDefault       = 0x0
	EventBlockingSync  = 0x1
	EventDisableTiming = 0x2
)

// IpcLazyEnablePeerAccess is the flag of IpcOpenMemHandle
// (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS).
const IpcLazyEnablePeerAccess = 0x1

// Attribute is a device attribute (CUdevice_attribute).
type Attribute int

// Device attributes used by the runtime.
const (
	AttrMultiprocessorCount    Attribute = 16
	AttrPCIBusID               Attribute = 33
	AttrPCIDeviceID            Attribute = 34
	AttrUnifiedAddressing      Attribute = 41
	AttrPCIDomainID            Attribute = 50
	AttrComputeCapabilityMajor Attribute = 75
	AttrComputeCapabilityMinor Attribute = 76
	AttrDmaBufSupported        Attribute = 124
)

// Context is the retained primary context of one device, valid for the life
// of the process. It is safe for concurrent use.
type Context struct {
	ordinal int
	dev     int32
	h       unsafe.Pointer // CUcontext (C memory, never a Go pointer)
}

// Ordinal returns the device ordinal of the context.
func (c *Context) Ordinal() int { return c.ordinal }

// Stream is a CUDA stream bound to a Context. Destroy must not race with
// other uses of the stream.
type Stream struct {
	ctx *Context
	h   unsafe.Pointer // CUstream
}

// Context returns the context the stream belongs to.
func (s *Stream) Context() *Context { return s.ctx }

// Event is a CUDA event bound to a Context. Destroy must not race with other
// uses of the event.
type Event struct {
	ctx *Context
	h   unsafe.Pointer // CUevent
}

// Module is a loaded PTX or cubin module.
type Module struct {
	ctx *Context
	h   unsafe.Pointer // CUmodule
}

// Function is a kernel of a Module; valid until the module is unloaded.
type Function struct {
	mod  *Module
	name string
	h    unsafe.Pointer // CUfunction
}

// Name returns the kernel's name.
func (f *Function) Name() string { return f.name }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// KernelArg is one kernel parameter of at most 8 bytes, held by value in
// little-endian order. Kernel parameters are copied by the driver at launch,
// so no Go memory outlives the launch call.
type KernelArg uint64

// ArgPtr passes a device pointer.
func ArgPtr(p DevicePtr) KernelArg { return KernelArg(p) }

// ArgUint64 passes a 64-bit integer (.u64/.s64 parameter).
func ArgUint64(v uint64) KernelArg { return KernelArg(v) }

// ArgInt32 passes a 32-bit integer (.s32/.u32 parameter).
func ArgInt32(v int32) KernelArg { return KernelArg(uint32(v)) }

// ArgFloat32 passes a float (.f32 parameter).
func ArgFloat32(f float32) KernelArg { return KernelArg(math.Float32bits(f)) }

// formatUUID renders a 16-byte device UUID the way nvidia-smi does:
// GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func formatUUID(b [16]byte) string {
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 40)
	out = append(out, "GPU-"...)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[c>>4], hex[c&15])
	}
	return string(out)
}

// argBytes is used by tests to check the encoding of kernel arguments.
func (a KernelArg) bytes() [8]byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(a))
	return b
}
