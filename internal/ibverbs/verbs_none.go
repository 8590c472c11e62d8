//go:build !linux || !cgo || noibverbs

package ibverbs

import "fmt"

// errNotBuilt is what every call returns in this build.
var errNotBuilt = fmt.Errorf("%w: built without verbs support (needs linux and cgo; tag noibverbs set or cgo off)", ErrNoRDMA)

// Available returns an error wrapping ErrNoRDMA in this build.
func Available() error { return errNotBuilt }

// Devices returns an empty list and an error wrapping ErrNoRDMA.
func Devices() ([]DeviceInfo, error) { return []DeviceInfo{}, errNotBuilt }

// Open fails with an error wrapping ErrNoRDMA.
func Open(name string) (*Context, error) { return nil, errNotBuilt }

// DmabufSupported reports false in this build.
func DmabufSupported() bool { return false }

func wcStatusString(s WCStatus) string { return fmt.Sprintf("status %d", uint32(s)) }

// Context is an open RDMA device (never created in this build).
type Context struct{}

// Name returns the device name.
func (c *Context) Name() string { return "" }

// Close fails with ErrNoRDMA in this build.
func (c *Context) Close() error { return errNotBuilt }

// QueryDevice fails with ErrNoRDMA in this build.
func (c *Context) QueryDevice() (DeviceAttr, error) { return DeviceAttr{}, errNotBuilt }

// QueryPort fails with ErrNoRDMA in this build.
func (c *Context) QueryPort(port uint8) (PortInfo, error) { return PortInfo{}, errNotBuilt }

// AllocPD fails with ErrNoRDMA in this build.
func (c *Context) AllocPD() (*PD, error) { return nil, errNotBuilt }

// CreateCQ fails with ErrNoRDMA in this build.
func (c *Context) CreateCQ(cqe int) (*CQ, error) { return nil, errNotBuilt }

// PD is a protection domain (never created in this build).
type PD struct{}

// Context returns nil in this build.
func (p *PD) Context() *Context { return nil }

// Close fails with ErrNoRDMA in this build.
func (p *PD) Close() error { return errNotBuilt }

// RegMR fails with ErrNoRDMA in this build.
func (p *PD) RegMR(addr uintptr, length int, access Access) (*MR, error) { return nil, errNotBuilt }

// RegDmabufMR fails with ErrNoRDMA in this build.
func (p *PD) RegDmabufMR(offset uint64, length int, iova uint64, fd int, access Access) (*MR, error) {
	return nil, errNotBuilt
}

// CreateRCQP fails with ErrNoRDMA in this build.
func (p *PD) CreateRCQP(cq *CQ, caps QPCaps) (*QP, error) { return nil, errNotBuilt }

// MR is a registered memory region (never created in this build).
type MR struct{}

// Addr returns 0 in this build.
func (m *MR) Addr() uint64 { return 0 }

// Len returns 0 in this build.
func (m *MR) Len() int { return 0 }

// LKey returns 0 in this build.
func (m *MR) LKey() uint32 { return 0 }

// RKey returns 0 in this build.
func (m *MR) RKey() uint32 { return 0 }

// Close fails with ErrNoRDMA in this build.
func (m *MR) Close() error { return errNotBuilt }

// CQ is a completion queue (never created in this build).
type CQ struct{}

// Close fails with ErrNoRDMA in this build.
func (q *CQ) Close() error { return errNotBuilt }

// Poll fails with ErrNoRDMA in this build.
func (q *CQ) Poll(wcs []WorkCompletion) (int, error) { return 0, errNotBuilt }

// QP is a reliable-connected queue pair (never created in this build).
type QP struct{}

// QPN returns 0 in this build.
func (q *QP) QPN() uint32 { return 0 }

// LocalEndpoint returns an empty endpoint in this build.
func (q *QP) LocalEndpoint(port PortInfo, psn uint32) Endpoint { return Endpoint{} }

// Close fails with ErrNoRDMA in this build.
func (q *QP) Close() error { return errNotBuilt }

// Init fails with ErrNoRDMA in this build.
func (q *QP) Init(port uint8, access Access) error { return errNotBuilt }

// ReadyToReceive fails with ErrNoRDMA in this build.
func (q *QP) ReadyToReceive(port PortInfo, remote Endpoint, opts ConnectOptions) error {
	return errNotBuilt
}

// ReadyToSend fails with ErrNoRDMA in this build.
func (q *QP) ReadyToSend(psn uint32, opts ConnectOptions) error { return errNotBuilt }

// Connect fails with ErrNoRDMA in this build.
func (q *QP) Connect(port PortInfo, access Access, remote Endpoint, localPSN uint32, opts ConnectOptions) error {
	return errNotBuilt
}

// SetError fails with ErrNoRDMA in this build.
func (q *QP) SetError() error { return errNotBuilt }

// State fails with ErrNoRDMA in this build.
func (q *QP) State() (QPState, error) { return QPUnknown, errNotBuilt }

// PostReads fails with ErrNoRDMA in this build.
func (q *QP) PostReads(reqs []ReadRequest) error { return errNotBuilt }

// MW is a memory window (never created in this build).
type MW struct{}

// AllocMW fails with ErrNoRDMA in this build.
func (p *PD) AllocMW() (*MW, error) { return nil, errNotBuilt }

// RKey returns 0 in this build.
func (m *MW) RKey() uint32 { return 0 }

// Close fails with ErrNoRDMA in this build.
func (m *MW) Close() error { return errNotBuilt }

// BindMW fails with ErrNoRDMA in this build.
func (q *QP) BindMW(wrid uint64, mw *MW, mr *MR, addr uint64, length int, access Access) (uint32, error) {
	return 0, errNotBuilt
}

// LocalInvalidate fails with ErrNoRDMA in this build.
func (q *QP) LocalInvalidate(wrid uint64, rkey uint32) error { return errNotBuilt }
