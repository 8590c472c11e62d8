package cuda

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors.
var (
	// ErrNoDevice means no usable CUDA device: no driver, a driver that sees
	// no GPU (CUDA_ERROR_NO_DEVICE), an ordinal out of range, or a build
	// without CUDA support. Callers treat it as "CUDA not viable here".
	ErrNoDevice = errors.New("cuda: no CUDA device")
	// ErrNoDriver means libcuda.so.1 could not be loaded or lacks a required
	// symbol. errors.Is(err, ErrNoDevice) is true for it as well.
	ErrNoDriver error = noDriverError{}
	// ErrMissingSymbol is returned by a call whose driver entry point this
	// libcuda.so.1 does not export (an older driver).
	ErrMissingSymbol = errors.New("cuda: symbol not exported by libcuda.so.1")
	// ErrDestroyed is returned when a stream, event or module is used after
	// Destroy or Unload.
	ErrDestroyed = errors.New("cuda: handle already destroyed")
)

type noDriverError struct{}

func (noDriverError) Error() string { return "cuda: no CUDA driver" }

// Is makes ErrNoDriver match ErrNoDevice.
func (noDriverError) Is(target error) bool { return target == ErrNoDevice }

// Result codes the package gives meaning to (values of the driver's
// CUresult).
const (
	Success                   = 0
	ErrorInvalidValue         = 1
	ErrorOutOfMemory          = 2
	ErrorNotInitialized       = 3
	ErrorNoDevice             = 100
	ErrorInvalidDevice        = 101
	ErrorNotReady             = 600
	ErrorPeerAccessEnabled    = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	ErrorHostMemoryRegistered = 712 // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
	ErrorNotSupported         = 801
)

// Error is a failed driver call.
type Error struct {
	Call string // driver entry point without version suffix, e.g. "cuMemAlloc"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"; empty when unknown
}

// Error returns "cuda: <Call>: <Name>", or "cuda: <Call>: CUresult <Code>"
// when the name is unknown.
func (e *Error) Error() string {
	if e.Name != "" {
		return "cuda: " + e.Call + ": " + e.Name
	}
	return "cuda: " + e.Call + ": CUresult " + strconv.Itoa(e.Code)
}

// Is matches ErrNoDevice for CUDA_ERROR_NO_DEVICE and
// CUDA_ERROR_INVALID_DEVICE.
func (e *Error) Is(target error) bool {
	return target == ErrNoDevice && (e.Code == ErrorNoDevice || e.Code == ErrorInvalidDevice)
}

// knownNames backs up cuGetErrorName for formatting without a driver and for
// codes an old driver does not name.
var knownNames = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	999: "CUDA_ERROR_UNKNOWN",
}

// newError builds the error of a failed call; lookup is the driver's
// cuGetErrorName when loaded (nil otherwise).
func newError(call string, code int, lookup func(int) string) *Error {
	e := &Error{Call: call, Code: code}
	if lookup != nil {
		e.Name = lookup(code)
	}
	if e.Name == "" {
		e.Name = knownNames[code]
	}
	return e
}

func missingSymbol(call string) error {
	return fmt.Errorf("cuda: %s: %w", call, ErrMissingSymbol)
}
