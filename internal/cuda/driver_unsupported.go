//go:build !linux || !cgo

package cuda

import (
	"fmt"
	"unsafe"
)

// MaxKernelArgs is the most parameters LaunchKernel passes.
const MaxKernelArgs = 64

// errUnsupported is returned by every call in builds without cgo or on
// other systems than Linux; it matches ErrNoDriver and ErrNoDevice.
var errUnsupported = fmt.Errorf("%w: not supported in this build (needs linux and cgo)", ErrNoDriver)

// Init reports that CUDA is not supported by this build.
func Init() error { return errUnsupported }

// DeviceCount reports that CUDA is not supported by this build.
func DeviceCount() (int, error) { return 0, errUnsupported }

// DeviceUUID reports that CUDA is not supported by this build.
func DeviceUUID(int) (string, error) { return "", errUnsupported }

// DevicePCIBusID reports that CUDA is not supported by this build.
func DevicePCIBusID(int) (string, error) { return "", errUnsupported }

// CanAccessPeer reports that CUDA is not supported by this build.
func CanAccessPeer(int, int) (bool, error) { return false, errUnsupported }

// TotalMem reports that CUDA is not supported by this build.
func TotalMem(int) (int64, error) { return 0, errUnsupported }

// DeviceGetAttribute reports that CUDA is not supported by this build.
func DeviceGetAttribute(Attribute, int) (int, error) { return 0, errUnsupported }

// Primary reports that CUDA is not supported by this build.
func Primary(int) (*Context, error) { return nil, errUnsupported }

// ElapsedTime reports that CUDA is not supported by this build.
func ElapsedTime(*Event, *Event) (float32, error) { return 0, errUnsupported }

// No Context, Stream, Event or Module can exist in this build; the methods
// below exist so code using them compiles.

// EnablePeerAccess reports that CUDA is not supported by this build.
func (c *Context) EnablePeerAccess(*Context) error { return errUnsupported }

// MemGetInfo reports that CUDA is not supported by this build.
func (c *Context) MemGetInfo() (free, total int64, err error) { return 0, 0, errUnsupported }

// MemAlloc reports that CUDA is not supported by this build.
func (c *Context) MemAlloc(int) (DevicePtr, error) { return 0, errUnsupported }

// MemFree reports that CUDA is not supported by this build.
func (c *Context) MemFree(DevicePtr) error { return errUnsupported }

// MemHostAlloc reports that CUDA is not supported by this build.
func (c *Context) MemHostAlloc(int, int) (unsafe.Pointer, error) { return nil, errUnsupported }

// MemFreeHost reports that CUDA is not supported by this build.
func (c *Context) MemFreeHost(unsafe.Pointer) error { return errUnsupported }

// MemHostRegister reports that CUDA is not supported by this build.
func (c *Context) MemHostRegister(uintptr, int, int) error { return errUnsupported }

// MemHostUnregister reports that CUDA is not supported by this build.
func (c *Context) MemHostUnregister(uintptr) error { return errUnsupported }

// MemcpyHtoD reports that CUDA is not supported by this build.
func (c *Context) MemcpyHtoD(DevicePtr, unsafe.Pointer, int) error { return errUnsupported }

// MemcpyDtoH reports that CUDA is not supported by this build.
func (c *Context) MemcpyDtoH(unsafe.Pointer, DevicePtr, int) error { return errUnsupported }

// MemcpyDtoD reports that CUDA is not supported by this build.
func (c *Context) MemcpyDtoD(DevicePtr, DevicePtr, int) error { return errUnsupported }

// MemcpyHtoDAsync reports that CUDA is not supported by this build.
func (c *Context) MemcpyHtoDAsync(DevicePtr, unsafe.Pointer, int, *Stream) error {
	return errUnsupported
}

// MemcpyDtoHAsync reports that CUDA is not supported by this build.
func (c *Context) MemcpyDtoHAsync(unsafe.Pointer, DevicePtr, int, *Stream) error {
	return errUnsupported
}

// MemcpyDtoDAsync reports that CUDA is not supported by this build.
func (c *Context) MemcpyDtoDAsync(DevicePtr, DevicePtr, int, *Stream) error { return errUnsupported }

// MemcpyPeerAsync reports that CUDA is not supported by this build.
func (c *Context) MemcpyPeerAsync(DevicePtr, *Context, DevicePtr, *Context, int, *Stream) error {
	return errUnsupported
}

// MemcpyHtoDWait reports that CUDA is not supported by this build.
func (c *Context) MemcpyHtoDWait(DevicePtr, unsafe.Pointer, int, *Stream) error {
	return errUnsupported
}

// MemcpyDtoHWait reports that CUDA is not supported by this build.
func (c *Context) MemcpyDtoHWait(unsafe.Pointer, DevicePtr, int, *Stream) error {
	return errUnsupported
}

// MemsetD8Async reports that CUDA is not supported by this build.
func (c *Context) MemsetD8Async(DevicePtr, byte, int, *Stream) error { return errUnsupported }

// MemGetAddressRange reports that CUDA is not supported by this build.
func (c *Context) MemGetAddressRange(DevicePtr) (base DevicePtr, size int, err error) {
	return 0, 0, errUnsupported
}

// MemGetHandleForAddressRange reports that CUDA is not supported by this
// build.
func (c *Context) MemGetHandleForAddressRange(DevicePtr, int) (fd int, err error) {
	return -1, errUnsupported
}

// NewStream reports that CUDA is not supported by this build.
func (c *Context) NewStream() (*Stream, error) { return nil, errUnsupported }

// Synchronize reports that CUDA is not supported by this build.
func (s *Stream) Synchronize() error { return errUnsupported }

// WaitEvent reports that CUDA is not supported by this build.
func (s *Stream) WaitEvent(*Event) error { return errUnsupported }

// Destroy reports that CUDA is not supported by this build.
func (s *Stream) Destroy() error { return errUnsupported }

// NewEvent reports that CUDA is not supported by this build.
func (c *Context) NewEvent(int) (*Event, error) { return nil, errUnsupported }

// Record reports that CUDA is not supported by this build.
func (e *Event) Record(*Stream) error { return errUnsupported }

// Synchronize reports that CUDA is not supported by this build.
func (e *Event) Synchronize() error { return errUnsupported }

// Query reports that CUDA is not supported by this build.
func (e *Event) Query() (bool, error) { return false, errUnsupported }

// Destroy reports that CUDA is not supported by this build.
func (e *Event) Destroy() error { return errUnsupported }

// IpcGetMemHandle reports that CUDA is not supported by this build.
func (c *Context) IpcGetMemHandle(DevicePtr) (IpcMemHandle, error) {
	return IpcMemHandle{}, errUnsupported
}

// IpcOpenMemHandle reports that CUDA is not supported by this build.
func (c *Context) IpcOpenMemHandle(IpcMemHandle, int) (DevicePtr, error) { return 0, errUnsupported }

// IpcCloseMemHandle reports that CUDA is not supported by this build.
func (c *Context) IpcCloseMemHandle(DevicePtr) error { return errUnsupported }

// ModuleLoadData reports that CUDA is not supported by this build.
func (c *Context) ModuleLoadData([]byte) (*Module, error) { return nil, errUnsupported }

// Function reports that CUDA is not supported by this build.
func (m *Module) Function(string) (*Function, error) { return nil, errUnsupported }

// Unload reports that CUDA is not supported by this build.
func (m *Module) Unload() error { return errUnsupported }

// LaunchKernel reports that CUDA is not supported by this build.
func (c *Context) LaunchKernel(*Function, Dim3, Dim3, uint32, *Stream, ...KernelArg) error {
	return errUnsupported
}
