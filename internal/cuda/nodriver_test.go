package cuda

import (
	"errors"
	"testing"
)

// TestWithoutDriver runs where no usable driver is present (this includes
// builds without cgo): every entry point must fail cleanly with an error
// matching ErrNoDevice, never panic.
func TestWithoutDriver(t *testing.T) {
	err := Init()
	if err == nil {
		t.Skip("a CUDA driver and device are present; the no-driver path is not reachable")
	}
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Init() = %v, want an error matching ErrNoDevice", err)
	}
	t.Logf("Init: %v", err)
	checks := map[string]error{}
	_, checks["DeviceCount"] = DeviceCount()
	_, checks["DeviceUUID"] = DeviceUUID(0)
	_, checks["DevicePCIBusID"] = DevicePCIBusID(0)
	_, checks["CanAccessPeer"] = CanAccessPeer(0, 1)
	_, checks["TotalMem"] = TotalMem(0)
	_, checks["DeviceGetAttribute"] = DeviceGetAttribute(AttrDmaBufSupported, 0)
	var ctx *Context
	ctx, checks["Primary"] = Primary(0)
	for name, err := range checks {
		if !errors.Is(err, ErrNoDevice) {
			t.Errorf("%s: %v, want an error matching ErrNoDevice", name, err)
		}
	}
	if ctx != nil {
		t.Errorf("Primary returned a context without a driver")
	}
}
