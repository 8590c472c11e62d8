package ibverbs

import (
	"fmt"
	"net"
)

// GID is a 128-bit port global identifier (an IPv6 address for RoCE).
type GID [16]byte

// IsZero reports whether the GID is all zeros (an empty table entry).
func (g GID) IsZero() bool { return g == GID{} }

// IPv4 returns the IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), or
// nil.
func (g GID) IPv4() net.IP {
	for _, b := range g[:10] {
		if b != 0 {
			return nil
		}
	}
	if g[10] != 0xff || g[11] != 0xff {
		return nil
	}
	return net.IPv4(g[12], g[13], g[14], g[15]).To4()
}

// String formats the GID as an IPv6 address.
func (g GID) String() string { return net.IP(g[:]).String() }

// GIDType says which protocol a GID table entry is for.
type GIDType uint8

// GID types, as enum ibv_gid_type.
const (
	GIDTypeIB GIDType = iota
	GIDTypeRoCEv1
	GIDTypeRoCEv2
	// GIDTypeUnknown is used when the library cannot report GID types.
	GIDTypeUnknown GIDType = 255
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB/RoCEv1"
	case GIDTypeRoCEv1:
		return "RoCEv1"
	case GIDTypeRoCEv2:
		return "RoCEv2"
	}
	return "unknown"
}

// GIDEntry is one non-empty entry of a port's GID table.
type GIDEntry struct {
	Index int
	GID   GID
	Type  GIDType
}

// PortState is a port's logical state (enum ibv_port_state).
type PortState uint8

// Port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// LinkLayer is a port's link layer.
type LinkLayer uint8

// Link layers (IBV_LINK_LAYER_*).
const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand:
		return "InfiniBand"
	case LinkEthernet:
		return "Ethernet"
	}
	return "unspecified"
}

// MTU is a path MTU as enum ibv_mtu (1 = 256 bytes ... 5 = 4096 bytes).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// PortInfo describes one port of a device.
type PortInfo struct {
	Num       uint8
	State     PortState
	LinkLayer LinkLayer
	ActiveMTU MTU
	MaxMTU    MTU
	LID       uint16 // InfiniBand local identifier; 0 on Ethernet
	// GIDs holds the non-empty GID table entries.
	GIDs []GIDEntry
	// RoCEv2IPv4 is the index of a RoCE v2 GID that maps an IPv4 address
	// (the usual choice for routable RoCE), or -1 when there is none.
	RoCEv2IPv4 int
}

// Usable reports whether the port can carry RC traffic now: active, and
// either InfiniBand with a LID or Ethernet with a RoCE v2 IPv4 GID.
func (p PortInfo) Usable() bool {
	if p.State != PortActive {
		return false
	}
	switch p.LinkLayer {
	case LinkEthernet:
		return p.RoCEv2IPv4 >= 0
	default:
		return p.LID != 0
	}
}

// GIDIndex returns the GID index to use on this port: the RoCE v2 IPv4 entry
// on Ethernet, -1 (no GRH) on InfiniBand.
func (p PortInfo) GIDIndex() int {
	if p.LinkLayer == LinkEthernet {
		return p.RoCEv2IPv4
	}
	return -1
}

// DeviceInfo describes an RDMA device and its ports.
type DeviceInfo struct {
	Name  string
	GUID  uint64 // node GUID, host byte order
	Ports []PortInfo
	// Err is set when the device was listed but could not be queried.
	Err error
}

// DeviceAttr holds the device limits a channel needs.
type DeviceAttr struct {
	FirmwareVersion string
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxCQE          int
	MaxMR           int
	// MaxQPRdAtom is how many RDMA READs a QP may have outstanding as a
	// responder; MaxQPInitRdAtom as an initiator.
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	PhysPortCount   int
	// CapFlags are the device's capability flags (device_cap_flags).
	CapFlags DeviceCap
}

// DeviceCap is a set of device capability flags (IBV_DEVICE_*).
type DeviceCap uint32

// Device capabilities this package's callers test.
const (
	// DeviceMemWindow: the device has memory windows (type 1 at least).
	DeviceMemWindow DeviceCap = 1 << 17
	// DeviceMemWindowType2A and DeviceMemWindowType2B: type-2 windows,
	// bound to one queue pair with IBV_WR_BIND_MW (2B: the window's QP is
	// checked on remote access).
	DeviceMemWindowType2A DeviceCap = 1 << 23
	DeviceMemWindowType2B DeviceCap = 1 << 24
)

// MemoryWindowType2 reports whether the device has type-2 memory windows
// that Bind can use (IBV_DEVICE_MEM_WINDOW_TYPE_2B).
func (a DeviceAttr) MemoryWindowType2() bool { return a.CapFlags&DeviceMemWindowType2B != 0 }

// Access is a set of memory-region / queue-pair access flags.
type Access uint32

// Access flags (IBV_ACCESS_*).
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	// AccessMWBind lets memory windows be bound to the region; a region
	// registered with it alone grants no remote access of its own.
	AccessMWBind Access = 1 << 4
)

// IncRKey returns rkey with its low 8 bits (the key a consumer owns)
// advanced, as ibv_inc_rkey does: the rkey a window gets at its next bind,
// so that rkeys of its earlier binds read nothing.
func IncRKey(rkey uint32) uint32 { return rkey&0xffffff00 | (rkey+1)&0xff }

// QPState is a queue pair state (enum ibv_qp_state).
type QPState uint8

// Queue pair states.
const (
	QPReset QPState = iota
	QPInit
	QPRTR
	QPRTS
	QPSQD
	QPSQE
	QPError
	QPUnknown
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPSQD:
		return "SQD"
	case QPSQE:
		return "SQE"
	case QPError:
		return "ERR"
	}
	return "UNKNOWN"
}

// Endpoint is what one side of an RC connection tells the other: enough to
// move its queue pair to RTR towards us.
type Endpoint struct {
	QPN uint32 // queue pair number (24 bits)
	PSN uint32 // first packet sequence number (24 bits)
	LID uint16 // InfiniBand LID; 0 on RoCE
	GID GID    // used when the remote's GIDIndex >= 0 (RoCE, or routed IB)
	// HasGID says the connection must use a global route header (RoCE).
	HasGID bool
	MTU    MTU // the sender's active MTU; the connection uses the smaller
}

// ConnectOptions are the RC parameters of Connect. Zero fields get
// defaults from DefaultConnectOptions.
type ConnectOptions struct {
	// Timeout is the local ACK timeout exponent: 4.096 µs × 2^Timeout
	// (14 = 67 ms).
	Timeout uint8
	// RetryCount is how many times a packet is resent before the QP fails
	// with a retry-exceeded completion (at most 7).
	RetryCount uint8
	// RNRRetry is the receiver-not-ready retry count (7 = forever).
	RNRRetry uint8
	// MaxRdAtomic is how many RDMA READs this QP may have outstanding as an
	// initiator; MaxDestRdAtomic how many it accepts as a responder.
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	// MinRNRTimer is the RNR NAK timer code (12 = 0.64 ms).
	MinRNRTimer uint8
	// HopLimit of the global route header (RoCE).
	HopLimit uint8
	// TrafficClass of the global route header.
	TrafficClass uint8
	// ServiceLevel of the path.
	ServiceLevel uint8
}

// DefaultConnectOptions returns the options Connect uses for zero fields:
// a 67 ms ACK timeout with 7 retries (a dead peer fails a transfer after
// about half a second), infinite RNR retry, 16 outstanding reads each way.
func DefaultConnectOptions() ConnectOptions {
	return ConnectOptions{
		Timeout:         14,
		RetryCount:      7,
		RNRRetry:        7,
		MaxRdAtomic:     16,
		MaxDestRdAtomic: 16,
		MinRNRTimer:     12,
		HopLimit:        64,
	}
}

func (o ConnectOptions) withDefaults() ConnectOptions {
	d := DefaultConnectOptions()
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.RetryCount == 0 {
		o.RetryCount = d.RetryCount
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = d.RNRRetry
	}
	if o.MaxRdAtomic == 0 {
		o.MaxRdAtomic = d.MaxRdAtomic
	}
	if o.MaxDestRdAtomic == 0 {
		o.MaxDestRdAtomic = d.MaxDestRdAtomic
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = d.MinRNRTimer
	}
	if o.HopLimit == 0 {
		o.HopLimit = d.HopLimit
	}
	return o
}

// QPCaps sizes a queue pair's work queues.
type QPCaps struct {
	MaxSendWR uint32 // outstanding send-queue work requests (default 128)
	MaxRecvWR uint32 // outstanding receive work requests (default 1)
	MaxSGE    uint32 // scatter/gather entries per request (default 1)
}

// ReadRequest is one RDMA READ: Length bytes from the remote region
// (RemoteAddr, RKey) into local memory (LocalAddr, LKey).
type ReadRequest struct {
	WRID       uint64
	LocalAddr  uintptr
	LKey       uint32
	Length     uint32
	RemoteAddr uint64
	RKey       uint32
	// Signaled asks for a work completion on success (failures always
	// complete).
	Signaled bool
}

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses used by callers; see ibv_wc_status for the rest.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCRemInvReqErr   WCStatus = 9
	WCGeneralErr     WCStatus = 21
)

// Work completion opcodes (enum ibv_wc_opcode) of the send queue.
const (
	WCOpRDMARead uint32 = 2
	WCOpBindMW   uint32 = 5
	WCOpLocalInv uint32 = 6
)

// WorkCompletion is one polled completion.
type WorkCompletion struct {
	WRID      uint64
	Status    WCStatus
	Opcode    uint32
	VendorErr uint32
	ByteLen   uint32
	QPN       uint32
}

// Err returns nil for a successful completion and a *WCError otherwise.
func (wc WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{WRID: wc.WRID, Status: wc.Status, VendorErr: wc.VendorErr, QPN: wc.QPN, Text: wcStatusString(wc.Status)}
}
