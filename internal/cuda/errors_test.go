package cuda

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		call   string
		code   int
		lookup func(int) string
		want   string
	}{
		{"cuMemcpyDtoHAsync", 1, nil, "cuda: cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE"},
		{"cuMemAlloc", 2, func(int) string { return "FROM_DRIVER" }, "cuda: cuMemAlloc: FROM_DRIVER"},
		{"cuMemAlloc", 2, func(int) string { return "" }, "cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"},
		{"cuInit", 12345, nil, "cuda: cuInit: CUresult 12345"},
	}
	for _, tt := range tests {
		if got := newError(tt.call, tt.code, tt.lookup).Error(); got != tt.want {
			t.Errorf("newError(%q, %d) = %q, want %q", tt.call, tt.code, got, tt.want)
		}
	}
}

func TestErrorIs(t *testing.T) {
	if !errors.Is(ErrNoDriver, ErrNoDevice) {
		t.Error("ErrNoDriver does not match ErrNoDevice")
	}
	wrapped := fmt.Errorf("%w: dlopen libcuda.so.1: not found", ErrNoDriver)
	if !errors.Is(wrapped, ErrNoDevice) || !errors.Is(wrapped, ErrNoDriver) {
		t.Error("wrapped ErrNoDriver lost its identity")
	}
	if !errors.Is(newError("cuInit", ErrorNoDevice, nil), ErrNoDevice) {
		t.Error("CUDA_ERROR_NO_DEVICE does not match ErrNoDevice")
	}
	if errors.Is(newError("cuMemAlloc", ErrorOutOfMemory, nil), ErrNoDevice) {
		t.Error("CUDA_ERROR_OUT_OF_MEMORY matches ErrNoDevice")
	}
	var e *Error
	if !errors.As(fmt.Errorf("ctx: %w", newError("cuMemFree", 1, nil)), &e) || e.Code != 1 || e.Call != "cuMemFree" {
		t.Errorf("errors.As gave %+v", e)
	}
	if err := missingSymbol("cuMemGetHandleForAddressRange"); !errors.Is(err, ErrMissingSymbol) ||
		err.Error() != "cuda: cuMemGetHandleForAddressRange: "+ErrMissingSymbol.Error() {
		t.Errorf("missingSymbol = %v", err)
	}
}

func TestFormatUUID(t *testing.T) {
	var b [16]byte
	for i := range b {
		b[i] = byte(i*17 + 1)
	}
	const want = "GPU-01122334-4556-6778-899a-abbccddeef00"
	if got := formatUUID(b); got != want {
		t.Errorf("formatUUID = %q, want %q", got, want)
	}
}

func TestKernelArgEncoding(t *testing.T) {
	tests := []struct {
		arg  KernelArg
		want [8]byte
	}{
		{ArgFloat32(1), [8]byte{0, 0, 0x80, 0x3f}},
		{ArgInt32(-2), [8]byte{0xfe, 0xff, 0xff, 0xff}},
		{ArgPtr(0x0102030405060708), [8]byte{8, 7, 6, 5, 4, 3, 2, 1}},
		{ArgUint64(1 << 40), [8]byte{0, 0, 0, 0, 0, 1}},
	}
	for _, tt := range tests {
		if got := tt.arg.bytes(); got != tt.want {
			t.Errorf("%#x encodes as % x, want % x", uint64(tt.arg), got, tt.want)
		}
	}
}
