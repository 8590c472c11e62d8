package ibverbs

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors of this package.
var (
	// ErrNoRDMA is wrapped by every error caused by rdma-core or an RDMA
	// device being absent (library not found, no device, build without
	// verbs support). The wrapping error says which.
	ErrNoRDMA = errors.New("ibverbs: RDMA not available")
	// ErrClosed is returned when a closed object is used.
	ErrClosed = errors.New("ibverbs: object closed")
	// ErrNotSupported is wrapped when the library lacks an optional entry
	// point (for example ibv_reg_dmabuf_mr before rdma-core 34).
	ErrNotSupported = errors.New("ibverbs: not supported by this libibverbs")
)

// CallError is a failed verbs call: the call (with the QP transition for
// ibv_modify_qp) and the errno. It unwraps to the syscall.Errno.
type CallError struct {
	Call  string
	Errno syscall.Errno
}

func (e *CallError) Error() string {
	return fmt.Sprintf("ibverbs: %s: %v (errno %d)", e.Call, e.Errno, int(e.Errno))
}

// Unwrap returns the errno.
func (e *CallError) Unwrap() error { return e.Errno }

// callErr builds a *CallError; errno 0 (a library that failed without
// setting errno) becomes EIO so the error is never nil.
func callErr(call string, errno syscall.Errno) error {
	if errno == 0 {
		errno = syscall.EIO
	}
	return &CallError{Call: call, Errno: errno}
}

// WCError is a work request that completed with an error status.
type WCError struct {
	WRID      uint64
	Status    WCStatus
	VendorErr uint32
	QPN       uint32
	Text      string // ibv_wc_status_str
}

func (e *WCError) Error() string {
	return fmt.Sprintf("ibverbs: work request %d on QP %d failed: %s (status %d, vendor error %#x)",
		e.WRID, e.QPN, e.Text, uint32(e.Status), e.VendorErr)
}
