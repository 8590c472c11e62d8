//go:build linux && cgo && !noibverbs

package ibverbs

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <errno.h>
#include <stdlib.h>
#include "verbs_shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// load opens libibverbs once and returns nil or an error wrapping ErrNoRDMA.
func load() error {
	var buf [512]C.char
	if C.tf_ibv_load(&buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: %s", ErrNoRDMA, C.GoString(&buf[0]))
	}
	return nil
}

// Available returns nil when libibverbs loads and lists at least one RDMA
// device, and otherwise an error wrapping ErrNoRDMA that says why.
func Available() error {
	devs, err := deviceNames()
	if err != nil {
		return err
	}
	if len(devs) == 0 {
		return fmt.Errorf("%w: no RDMA device (libibverbs lists none)", ErrNoRDMA)
	}
	return nil
}

// deviceNames lists the device names without opening them.
func deviceNames() ([]string, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n C.int
	list, errno := C.tf_get_device_list(&n)
	if list == nil {
		return nil, listErr(errnoOf(errno))
	}
	defer C.tf_free_device_list(list)
	names := make([]string, 0, int(n))
	for i := 0; i < int(n); i++ {
		names = append(names, C.GoString(C.tf_get_device_name(C.tf_device_at(list, C.int(i)))))
	}
	return names, nil
}

// Devices lists the RDMA devices with their ports. Without rdma-core it
// returns an empty list and an error wrapping ErrNoRDMA; a device that is
// listed but cannot be opened or queried is returned with Err set.
func Devices() ([]DeviceInfo, error) {
	if err := load(); err != nil {
		return []DeviceInfo{}, err
	}
	var n C.int
	list, errno := C.tf_get_device_list(&n)
	if list == nil {
		return []DeviceInfo{}, listErr(errnoOf(errno))
	}
	defer C.tf_free_device_list(list)
	out := make([]DeviceInfo, 0, int(n))
	for i := 0; i < int(n); i++ {
		dev := C.tf_device_at(list, C.int(i))
		info := DeviceInfo{
			Name: C.GoString(C.tf_get_device_name(dev)),
			GUID: uint64(C.tf_get_device_guid(dev)),
		}
		cctx, errno := C.tf_open_device(dev)
		if cctx == nil {
			info.Err = callErr("ibv_open_device("+info.Name+")", errnoOf(errno))
			out = append(out, info)
			continue
		}
		c := &Context{ctx: cctx, name: info.Name}
		info.Ports, info.Err = c.queryPorts()
		if err := c.Close(); err != nil && info.Err == nil {
			info.Err = err
		}
		out = append(out, info)
	}
	return out, nil
}

// listErr explains a failed ibv_get_device_list; it wraps ErrNoRDMA.
func listErr(errno syscall.Errno) error {
	if errno == syscall.ENOSYS {
		return fmt.Errorf("%w: no RDMA device (the kernel exposes no verbs devices: %w)", ErrNoRDMA, callErr("ibv_get_device_list", errno))
	}
	return fmt.Errorf("%w: %w", ErrNoRDMA, callErr("ibv_get_device_list", errno))
}

// errnoOf extracts the errno cgo returned alongside a call.
func errnoOf(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return 0
}

// rcErr turns a verbs int return (0, an errno, or -1 with errno set) into an
// error naming call.
func rcErr(call string, rc C.int, err error) error {
	if rc == 0 {
		return nil
	}
	if rc > 0 {
		return callErr(call, syscall.Errno(rc))
	}
	if rc < -1 {
		return callErr(call, syscall.Errno(-rc))
	}
	return callErr(call, errnoOf(err))
}

// Context is an open RDMA device. Its methods are safe for concurrent use.
type Context struct {
	mu   sync.RWMutex
	ctx  *C.struct_ibv_context
	name string
}

// Open opens the RDMA device with the given name (as in Devices). An unknown
// name gives an error wrapping ErrNoRDMA.
func Open(name string) (*Context, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n C.int
	list, errno := C.tf_get_device_list(&n)
	if list == nil {
		return nil, listErr(errnoOf(errno))
	}
	defer C.tf_free_device_list(list)
	for i := 0; i < int(n); i++ {
		dev := C.tf_device_at(list, C.int(i))
		if C.GoString(C.tf_get_device_name(dev)) != name {
			continue
		}
		cctx, errno := C.tf_open_device(dev)
		if cctx == nil {
			return nil, callErr("ibv_open_device("+name+")", errnoOf(errno))
		}
		return &Context{ctx: cctx, name: name}, nil
	}
	return nil, fmt.Errorf("%w: no RDMA device named %q", ErrNoRDMA, name)
}

// Name returns the device name.
func (c *Context) Name() string { return c.name }

// Close closes the device. It fails with EBUSY while protection domains or
// completion queues of the context remain. Closing twice returns ErrClosed.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return ErrClosed
	}
	rc, err := C.tf_close_device(c.ctx)
	if e := rcErr("ibv_close_device("+c.name+")", rc, err); e != nil {
		return e
	}
	c.ctx = nil
	return nil
}

// QueryDevice returns the device limits.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return DeviceAttr{}, ErrClosed
	}
	var a C.struct_tf_device_attr
	rc, err := C.tf_query_device(c.ctx, &a)
	if e := rcErr("ibv_query_device("+c.name+")", rc, err); e != nil {
		return DeviceAttr{}, e
	}
	return DeviceAttr{
		FirmwareVersion: C.GoString(&a.fw_ver[0]),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		PhysPortCount:   int(a.phys_port_cnt),
		CapFlags:        DeviceCap(a.device_cap_flags),
	}, nil
}

func (c *Context) queryPorts() ([]PortInfo, error) {
	attr, err := c.QueryDevice()
	if err != nil {
		return nil, err
	}
	ports := make([]PortInfo, 0, attr.PhysPortCount)
	for p := 1; p <= attr.PhysPortCount && p <= 255; p++ {
		pi, err := c.QueryPort(uint8(p))
		if err != nil {
			return ports, err
		}
		ports = append(ports, pi)
	}
	return ports, nil
}

// QueryPort returns a port's state, link layer, MTU, LID and GID table.
// Ports are numbered from 1.
func (c *Context) QueryPort(port uint8) (PortInfo, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return PortInfo{}, ErrClosed
	}
	var a C.struct_tf_port_attr
	call := fmt.Sprintf("ibv_query_port(%s, %d)", c.name, port)
	rc, err := C.tf_query_port(c.ctx, C.uint8_t(port), &a)
	if e := rcErr(call, rc, err); e != nil {
		return PortInfo{}, e
	}
	pi := PortInfo{
		Num:        port,
		State:      PortState(a.state),
		LinkLayer:  LinkLayer(a.link_layer),
		ActiveMTU:  MTU(a.active_mtu),
		MaxMTU:     MTU(a.max_mtu),
		LID:        uint16(a.lid),
		RoCEv2IPv4: -1,
	}
	if pi.LinkLayer == LinkUnspecified {
		pi.LinkLayer = LinkInfiniBand // what libibverbs documents for old kernels
	}
	pi.GIDs, err = c.gidTable(port, int(a.gid_tbl_len))
	if err != nil {
		return pi, err
	}
	for _, g := range pi.GIDs {
		if g.Type == GIDTypeRoCEv2 && g.GID.IPv4() != nil {
			pi.RoCEv2IPv4 = g.Index
			break
		}
	}
	return pi, nil
}

// gidTable reads the non-empty GID entries of a port, with their types.
// Called with c.mu held.
func (c *Context) gidTable(port uint8, tblLen int) ([]GIDEntry, error) {
	if tblLen <= 0 {
		return nil, nil
	}
	gids := make([]byte, 16*tblLen)
	types := make([]C.uint32_t, tblLen)
	idx := make([]C.int, tblLen)
	n := C.tf_query_gid_table(c.ctx, C.uint8_t(port), (*C.uint8_t)(unsafe.Pointer(&gids[0])), &types[0], &idx[0], C.int(tblLen))
	if n >= 0 {
		out := make([]GIDEntry, 0, int(n))
		for i := 0; i < int(n); i++ {
			var g GID
			copy(g[:], gids[16*i:16*i+16])
			if g.IsZero() {
				continue
			}
			out = append(out, GIDEntry{Index: int(idx[i]), GID: g, Type: GIDType(types[i])})
		}
		return out, nil
	}
	// Older library: one entry at a time, types from the query or sysfs.
	var out []GIDEntry
	for i := 0; i < tblLen; i++ {
		var g GID
		rc, err := C.tf_query_gid(c.ctx, C.uint8_t(port), C.int(i), (*C.uint8_t)(unsafe.Pointer(&g[0])))
		if rc != 0 {
			if i == 0 {
				return nil, rcErr(fmt.Sprintf("ibv_query_gid(%s, %d, %d)", c.name, port, i), rc, err)
			}
			continue
		}
		if g.IsZero() {
			continue
		}
		e := GIDEntry{Index: i, GID: g, Type: GIDTypeUnknown}
		var t C.uint32_t
		if C.tf_query_gid_type(c.ctx, C.uint8_t(port), C.int(i), &t) == 0 {
			e.Type = GIDType(t)
		} else {
			e.Type = sysfsGIDType(c.name, port, i)
		}
		out = append(out, e)
	}
	return out, nil
}

// sysfsGIDType reads a GID's type from sysfs (kernels without the query).
func sysfsGIDType(dev string, port uint8, index int) GIDType {
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports", fmt.Sprint(port), "gid_attrs/types", fmt.Sprint(index)))
	if err != nil {
		return GIDTypeUnknown
	}
	switch s := strings.TrimSpace(string(b)); {
	case strings.EqualFold(s, "RoCE v2"):
		return GIDTypeRoCEv2
	case strings.Contains(s, "RoCE"), strings.Contains(s, "IB"):
		return GIDTypeRoCEv1
	}
	return GIDTypeUnknown
}

// AllocPD allocates a protection domain. Memory regions and queue pairs of
// one PD can be used together only.
func (c *Context) AllocPD() (*PD, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return nil, ErrClosed
	}
	pd, err := C.tf_alloc_pd(c.ctx)
	if pd == nil {
		return nil, callErr("ibv_alloc_pd("+c.name+")", errnoOf(err))
	}
	return &PD{ctx: c, pd: pd}, nil
}

// CreateCQ creates a completion queue with room for at least cqe entries.
func (c *Context) CreateCQ(cqe int) (*CQ, error) {
	if cqe <= 0 || cqe > 1<<24 {
		return nil, callErr(fmt.Sprintf("ibv_create_cq(%d entries)", cqe), syscall.EINVAL)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ctx == nil {
		return nil, ErrClosed
	}
	cq, err := C.tf_create_cq(c.ctx, C.int(cqe))
	if cq == nil {
		return nil, callErr(fmt.Sprintf("ibv_create_cq(%s, %d)", c.name, cqe), errnoOf(err))
	}
	return &CQ{ctx: c, cq: cq}, nil
}

// PD is a protection domain.
type PD struct {
	mu  sync.RWMutex
	ctx *Context
	pd  *C.struct_ibv_pd
}

// Context returns the device context of the PD.
func (p *PD) Context() *Context { return p.ctx }

// Close deallocates the PD; it fails with EBUSY while memory regions or
// queue pairs of the PD remain.
func (p *PD) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pd == nil {
		return ErrClosed
	}
	rc, err := C.tf_dealloc_pd(p.pd)
	if e := rcErr("ibv_dealloc_pd", rc, err); e != nil {
		return e
	}
	p.pd = nil
	return nil
}

// RegMR registers length bytes at addr. For host memory addr is a CPU
// address (a memory.Buffer's Ptr); the memory must stay allocated and
// reachable until the MR is closed (Go's collector does not move heap
// objects, but it may free them). With a GPU peer-memory driver
// (nvidia-peermem) addr may also be a CUDA device pointer. The MR's Addr is
// addr itself.
func (p *PD) RegMR(addr uintptr, length int, access Access) (*MR, error) {
	call := fmt.Sprintf("ibv_reg_mr(%#x, %d, access %#x)", addr, length, uint32(access))
	if length <= 0 || addr == 0 {
		return nil, callErr(call, syscall.EINVAL)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.pd == nil {
		return nil, ErrClosed
	}
	mr, err := C.tf_reg_mr(p.pd, C.uint64_t(addr), C.size_t(length), C.int(access))
	if mr == nil {
		return nil, callErr(call, errnoOf(err))
	}
	return &MR{mr: mr, addr: uint64(addr), length: length, lkey: uint32(C.tf_mr_lkey(mr)), rkey: uint32(C.tf_mr_rkey(mr))}, nil
}

// DmabufSupported reports whether the loaded libibverbs has
// ibv_reg_dmabuf_mr (rdma-core 34 or later).
func DmabufSupported() bool {
	return load() == nil && C.tf_have_dmabuf() != 0
}

// RegDmabufMR registers length bytes at offset of the dmabuf fd (for GPU
// memory, from cuMemGetHandleForAddressRange); remote peers address the
// region from iova (usually the device pointer). The fd may be closed after
// registration. It wraps ErrNotSupported when the library lacks the call.
func (p *PD) RegDmabufMR(offset uint64, length int, iova uint64, fd int, access Access) (*MR, error) {
	call := fmt.Sprintf("ibv_reg_dmabuf_mr(fd %d, offset %d, %d bytes, access %#x)", fd, offset, length, uint32(access))
	if length <= 0 || fd < 0 {
		return nil, callErr(call, syscall.EINVAL)
	}
	if !DmabufSupported() {
		return nil, fmt.Errorf("%w: %s", ErrNotSupported, call)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.pd == nil {
		return nil, ErrClosed
	}
	mr, err := C.tf_reg_dmabuf_mr(p.pd, C.uint64_t(offset), C.size_t(length), C.uint64_t(iova), C.int(fd), C.int(access))
	if mr == nil {
		return nil, callErr(call, errnoOf(err))
	}
	return &MR{mr: mr, addr: iova, length: length, lkey: uint32(C.tf_mr_lkey(mr)), rkey: uint32(C.tf_mr_rkey(mr))}, nil
}

// MR is a registered memory region.
type MR struct {
	mu     sync.Mutex
	mr     *C.struct_ibv_mr
	addr   uint64
	length int
	lkey   uint32
	rkey   uint32
}

// Addr is the address work requests use for the region's first byte.
func (m *MR) Addr() uint64 { return m.addr }

// Len is the registered length in bytes.
func (m *MR) Len() int { return m.length }

// LKey is the local key for local scatter/gather entries.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the remote key a peer needs to access the region.
func (m *MR) RKey() uint32 { return m.rkey }

// Close deregisters the region: its rkey no longer grants access. Closing
// twice returns ErrClosed.
func (m *MR) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mr == nil {
		return ErrClosed
	}
	rc, err := C.tf_dereg_mr(m.mr)
	if e := rcErr("ibv_dereg_mr", rc, err); e != nil {
		return e
	}
	m.mr = nil
	return nil
}

// MW is a type-2 memory window: a remote key granting access to a range of
// a memory region registered with AccessMWBind, bound and invalidated
// through one queue pair's send queue (BindMW, LocalInvalidate) without
// registering anything.
type MW struct {
	mu   sync.Mutex
	mw   *C.struct_ibv_mw
	rkey uint32 // the rkey of the last bind posted
}

// AllocMW allocates a type-2 memory window in the PD. The window grants
// nothing until bound. It fails (EOPNOTSUPP or ENOSYS) on a device without
// memory windows.
func (p *PD) AllocMW() (*MW, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.pd == nil {
		return nil, ErrClosed
	}
	mw, err := C.tf_alloc_mw_type2(p.pd)
	if mw == nil {
		return nil, callErr("ibv_alloc_mw(IBV_MW_TYPE_2)", errnoOf(err))
	}
	return &MW{mw: mw, rkey: uint32(C.tf_mw_rkey(mw))}, nil
}

// RKey returns the rkey of the window's last bind (or its initial rkey).
func (m *MW) RKey() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rkey
}

// Close deallocates the window; its rkey grants nothing after. Closing
// twice returns ErrClosed.
func (m *MW) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mw == nil {
		return ErrClosed
	}
	rc, err := C.tf_dealloc_mw(m.mw)
	if e := rcErr("ibv_dealloc_mw", rc, err); e != nil {
		return e
	}
	m.mw = nil
	return nil
}

// BindMW posts a signaled IBV_WR_BIND_MW on q binding the window to
// [addr, addr+length) of mr (which must have AccessMWBind) with the given
// remote access, and returns the rkey the bind gives it (IncRKey of the
// previous one). The rkey is usable once the bind's work completion
// (opcode WCOpBindMW, wrid) reports success, through q only. A window must
// be unbound (fresh, or invalidated) before it is bound again.
func (q *QP) BindMW(wrid uint64, mw *MW, mr *MR, addr uint64, length int, access Access) (uint32, error) {
	call := fmt.Sprintf("ibv_post_send(QP %d, BIND_MW %#x+%d, access %#x)", q.qpn, addr, length, uint32(access))
	if length <= 0 {
		return 0, callErr(call, syscall.EINVAL)
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.qp == nil {
		return 0, ErrClosed
	}
	mw.mu.Lock()
	defer mw.mu.Unlock()
	if mw.mw == nil {
		return 0, ErrClosed
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if mr.mr == nil {
		return 0, ErrClosed
	}
	rkey := IncRKey(mw.rkey)
	rc := C.tf_post_bind_mw(q.qp, mw.mw, mr.mr, C.uint64_t(wrid), C.uint64_t(addr), C.uint64_t(length), C.int(access), C.uint32_t(rkey))
	if rc != 0 {
		return 0, callErr(call, syscall.Errno(rc))
	}
	mw.rkey = rkey
	return rkey, nil
}

// LocalInvalidate posts a signaled IBV_WR_LOCAL_INV of rkey (a window
// bound through q): once it completes (opcode WCOpLocalInv) the rkey
// grants nothing and the window can be bound again.
func (q *QP) LocalInvalidate(wrid uint64, rkey uint32) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.qp == nil {
		return ErrClosed
	}
	if rc := C.tf_post_local_inv(q.qp, C.uint64_t(wrid), C.uint32_t(rkey)); rc != 0 {
		return callErr(fmt.Sprintf("ibv_post_send(QP %d, LOCAL_INV %#x)", q.qpn, rkey), syscall.Errno(rc))
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	mu  sync.RWMutex
	ctx *Context
	cq  *C.struct_ibv_cq
}

// Close destroys the CQ; it fails with EBUSY while queue pairs use it.
func (q *CQ) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cq == nil {
		return ErrClosed
	}
	rc, err := C.tf_destroy_cq(q.cq)
	if e := rcErr("ibv_destroy_cq", rc, err); e != nil {
		return e
	}
	q.cq = nil
	return nil
}

// Poll fills wcs with completed work requests without blocking and returns
// how many. Check each one's Err.
func (q *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.cq == nil {
		return 0, ErrClosed
	}
	var buf [16]C.struct_tf_wc
	total := 0
	for total < len(wcs) {
		want := min(len(wcs)-total, len(buf))
		n := int(C.tf_poll_cq(q.cq, &buf[0], C.int(want)))
		if n < 0 {
			if total > 0 {
				break
			}
			return 0, callErr("ibv_poll_cq", syscall.Errno(-n))
		}
		for i := 0; i < n; i++ {
			w := &buf[i]
			wcs[total+i] = WorkCompletion{
				WRID: uint64(w.wr_id), Status: WCStatus(w.status), Opcode: uint32(w.opcode),
				VendorErr: uint32(w.vendor_err), ByteLen: uint32(w.byte_len), QPN: uint32(w.qp_num),
			}
		}
		total += n
		if n < want {
			break
		}
	}
	return total, nil
}

func wcStatusString(s WCStatus) string {
	if load() != nil {
		return fmt.Sprintf("status %d", uint32(s))
	}
	return C.GoString(C.tf_wc_status_str(C.uint32_t(s)))
}

// QP is a reliable-connected queue pair.
type QP struct {
	mu    sync.RWMutex
	pd    *PD
	qp    *C.struct_ibv_qp
	qpn   uint32
	state QPState // last state this package moved it to
}

// CreateRCQP creates a reliable-connected QP in RESET whose send and receive
// completions go to cq. Zero caps get defaults (128 send WRs, 1 receive WR,
// 1 SGE).
func (p *PD) CreateRCQP(cq *CQ, caps QPCaps) (*QP, error) {
	if caps.MaxSendWR == 0 {
		caps.MaxSendWR = 128
	}
	if caps.MaxRecvWR == 0 {
		caps.MaxRecvWR = 1
	}
	if caps.MaxSGE == 0 {
		caps.MaxSGE = 1
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.pd == nil {
		return nil, ErrClosed
	}
	cq.mu.RLock()
	defer cq.mu.RUnlock()
	if cq.cq == nil {
		return nil, ErrClosed
	}
	qp, err := C.tf_create_rc_qp(p.pd, cq.cq, cq.cq, C.uint32_t(caps.MaxSendWR), C.uint32_t(caps.MaxRecvWR), C.uint32_t(caps.MaxSGE))
	if qp == nil {
		return nil, callErr(fmt.Sprintf("ibv_create_qp(RC, %d send WRs)", caps.MaxSendWR), errnoOf(err))
	}
	return &QP{pd: p, qp: qp, qpn: uint32(C.tf_qp_num(qp)), state: QPReset}, nil
}

// QPN returns the queue pair number.
func (q *QP) QPN() uint32 { return q.qpn }

// LocalEndpoint returns what the peer needs to connect to this QP through
// port, starting at packet sequence number psn.
func (q *QP) LocalEndpoint(port PortInfo, psn uint32) Endpoint {
	e := Endpoint{QPN: q.qpn, PSN: psn & 0xffffff, LID: port.LID, MTU: port.ActiveMTU}
	if gi := port.GIDIndex(); gi >= 0 {
		for _, g := range port.GIDs {
			if g.Index == gi {
				e.GID, e.HasGID = g.GID, true
			}
		}
	}
	return e
}

// Close destroys the QP; outstanding work requests are dropped.
func (q *QP) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return ErrClosed
	}
	rc, err := C.tf_destroy_qp(q.qp)
	if e := rcErr("ibv_destroy_qp", rc, err); e != nil {
		return e
	}
	q.qp = nil
	return nil
}

// modify runs one state transition through do and records it.
func (q *QP) modify(to QPState, do func(*C.struct_ibv_qp) C.int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return ErrClosed
	}
	if rc := do(q.qp); rc != 0 {
		errno := syscall.Errno(rc)
		if rc < 0 {
			errno = syscall.Errno(-rc) // -1 (no errno) becomes EPERM: use EIO
			if rc == -1 {
				errno = syscall.EIO
			}
		}
		return callErr(fmt.Sprintf("ibv_modify_qp(QP %d %s->%s)", q.qpn, q.state, to), errno)
	}
	q.state = to
	return nil
}

// Init moves the QP from RESET to INIT on port, allowing remote peers the
// given access (AccessRemoteRead for a region owner).
func (q *QP) Init(port uint8, access Access) error {
	return q.modify(QPInit, func(qp *C.struct_ibv_qp) C.int {
		return C.tf_qp_to_init(qp, C.uint8_t(port), C.int(access))
	})
}

// ReadyToReceive moves the QP from INIT to RTR towards remote, through the
// local port (whose GID index is used when the remote has a GID).
func (q *QP) ReadyToReceive(port PortInfo, remote Endpoint, opts ConnectOptions) error {
	opts = opts.withDefaults()
	mtu := port.ActiveMTU
	if remote.MTU != 0 && remote.MTU < mtu {
		mtu = remote.MTU
	}
	var a C.struct_tf_rtr
	a.path_mtu = C.uint32_t(mtu)
	a.dest_qp_num = C.uint32_t(remote.QPN & 0xffffff)
	a.rq_psn = C.uint32_t(remote.PSN & 0xffffff)
	a.max_dest_rd_atomic = C.uint8_t(opts.MaxDestRdAtomic)
	a.min_rnr_timer = C.uint8_t(opts.MinRNRTimer)
	a.dlid = C.uint16_t(remote.LID)
	a.sl = C.uint8_t(opts.ServiceLevel)
	a.port_num = C.uint8_t(port.Num)
	if remote.HasGID {
		gi := port.GIDIndex()
		if gi < 0 {
			return callErr(fmt.Sprintf("ibv_modify_qp(QP %d %s->RTR): remote needs a GID but port %d has no usable GID", q.qpn, q.state, port.Num), syscall.EINVAL)
		}
		a.is_global = 1
		a.sgid_index = C.uint8_t(gi)
		a.hop_limit = C.uint8_t(opts.HopLimit)
		a.traffic_class = C.uint8_t(opts.TrafficClass)
		for i, b := range remote.GID {
			a.dgid[i] = C.uint8_t(b)
		}
	}
	return q.modify(QPRTR, func(qp *C.struct_ibv_qp) C.int { return C.tf_qp_to_rtr(qp, &a) })
}

// ReadyToSend moves the QP from RTR to RTS; psn is the local first packet
// sequence number (the PSN of LocalEndpoint).
func (q *QP) ReadyToSend(psn uint32, opts ConnectOptions) error {
	opts = opts.withDefaults()
	var a C.struct_tf_rts
	a.timeout = C.uint8_t(opts.Timeout)
	a.retry_cnt = C.uint8_t(min(opts.RetryCount, 7))
	a.rnr_retry = C.uint8_t(min(opts.RNRRetry, 7))
	a.sq_psn = C.uint32_t(psn & 0xffffff)
	a.max_rd_atomic = C.uint8_t(opts.MaxRdAtomic)
	return q.modify(QPRTS, func(qp *C.struct_ibv_qp) C.int { return C.tf_qp_to_rts(qp, &a) })
}

// Connect runs RESET→INIT→RTR→RTS: the QP then reads from and accepts
// access from remote. localPSN must be the PSN sent to the peer in
// LocalEndpoint.
func (q *QP) Connect(port PortInfo, access Access, remote Endpoint, localPSN uint32, opts ConnectOptions) error {
	if err := q.Init(port.Num, access); err != nil {
		return err
	}
	if err := q.ReadyToReceive(port, remote, opts); err != nil {
		return err
	}
	return q.ReadyToSend(localPSN, opts)
}

// SetError moves the QP to the error state: outstanding work requests
// complete with WCWRFlushErr, so pollers waiting for them finish.
func (q *QP) SetError() error {
	return q.modify(QPError, func(qp *C.struct_ibv_qp) C.int { return C.tf_qp_to_err(qp) })
}

// State queries the QP's current state from the device (it moves to ERR by
// itself after a failed work request).
func (q *QP) State() (QPState, error) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.qp == nil {
		return QPUnknown, ErrClosed
	}
	var s C.int
	rc, err := C.tf_query_qp_state(q.qp, &s)
	if e := rcErr(fmt.Sprintf("ibv_query_qp(QP %d)", q.qpn), rc, err); e != nil {
		return QPUnknown, e
	}
	return QPState(s), nil
}

// PostReads posts RDMA READs as one chain. On failure the error names how
// many were posted before the first refused one; those still complete.
func (q *QP) PostReads(reqs []ReadRequest) error {
	if len(reqs) == 0 {
		return nil
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.qp == nil {
		return ErrClosed
	}
	wrs := make([]C.struct_tf_read, len(reqs))
	for i, r := range reqs {
		wrs[i] = C.struct_tf_read{
			wr_id: C.uint64_t(r.WRID), laddr: C.uint64_t(r.LocalAddr), raddr: C.uint64_t(r.RemoteAddr),
			length: C.uint32_t(r.Length), lkey: C.uint32_t(r.LKey), rkey: C.uint32_t(r.RKey),
		}
		if r.Signaled {
			wrs[i].signaled = 1
		}
	}
	var bad C.int
	rc := C.tf_post_reads(q.qp, &wrs[0], C.int(len(wrs)), &bad)
	if rc != 0 {
		return callErr(fmt.Sprintf("ibv_post_send(QP %d, %d RDMA READs, %d posted)", q.qpn, len(reqs), int(bad)), syscall.Errno(rc))
	}
	return nil
}
