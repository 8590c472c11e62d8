package ibverbs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestGIDIPv4(t *testing.T) {
	var g GID
	copy(g[:], net.ParseIP("10.99.0.1").To16())
	if ip := g.IPv4(); !ip.Equal(net.IPv4(10, 99, 0, 1)) {
		t.Fatalf("IPv4() = %v", ip)
	}
	var ll GID
	copy(ll[:], net.ParseIP("fe80::1").To16())
	if ip := ll.IPv4(); ip != nil {
		t.Fatalf("link-local GID gave IPv4 %v", ip)
	}
	if !(GID{}).IsZero() || g.IsZero() {
		t.Fatal("IsZero wrong")
	}
	if g.String() != "10.99.0.1" {
		t.Fatalf("String() = %q", g.String())
	}
}

func TestMTUBytes(t *testing.T) {
	for m, want := range map[MTU]int{0: 0, MTU256: 256, MTU1024: 1024, MTU4096: 4096, 6: 0} {
		if got := m.Bytes(); got != want {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", m, got, want)
		}
	}
}

func TestPortUsable(t *testing.T) {
	cases := []struct {
		name string
		p    PortInfo
		want bool
		gi   int
	}{
		{"roce v2 active", PortInfo{State: PortActive, LinkLayer: LinkEthernet, RoCEv2IPv4: 1}, true, 1},
		{"roce without ipv4 gid", PortInfo{State: PortActive, LinkLayer: LinkEthernet, RoCEv2IPv4: -1}, false, -1},
		{"roce down", PortInfo{State: PortDown, LinkLayer: LinkEthernet, RoCEv2IPv4: 1}, false, 1},
		{"ib with lid", PortInfo{State: PortActive, LinkLayer: LinkInfiniBand, LID: 3, RoCEv2IPv4: -1}, true, -1},
		{"ib without lid", PortInfo{State: PortActive, LinkLayer: LinkInfiniBand, RoCEv2IPv4: -1}, false, -1},
	}
	for _, c := range cases {
		if got := c.p.Usable(); got != c.want {
			t.Errorf("%s: Usable() = %v, want %v", c.name, got, c.want)
		}
		if got := c.p.GIDIndex(); got != c.gi {
			t.Errorf("%s: GIDIndex() = %d, want %d", c.name, got, c.gi)
		}
	}
}

func TestConnectOptionDefaults(t *testing.T) {
	got := ConnectOptions{Timeout: 10}.withDefaults()
	want := DefaultConnectOptions()
	want.Timeout = 10
	if got != want {
		t.Fatalf("withDefaults = %+v, want %+v", got, want)
	}
}

func TestWorkCompletionErr(t *testing.T) {
	if err := (WorkCompletion{WRID: 1}).Err(); err != nil {
		t.Fatalf("success gave %v", err)
	}
	err := WorkCompletion{WRID: 7, Status: WCRemAccessErr, QPN: 5}.Err()
	var wce *WCError
	if !errors.As(err, &wce) || wce.Status != WCRemAccessErr || wce.WRID != 7 {
		t.Fatalf("Err() = %v", err)
	}
	if !strings.HasPrefix(err.Error(), "ibverbs: work request 7 on QP 5 failed") {
		t.Fatalf("message %q", err.Error())
	}
}

func TestCallErrorNamesCallAndErrno(t *testing.T) {
	err := callErr("ibv_modify_qp(QP 3 INIT->RTR)", 22)
	if !strings.Contains(err.Error(), "ibv_modify_qp(QP 3 INIT->RTR)") || !strings.Contains(err.Error(), "errno 22") {
		t.Fatalf("message %q", err.Error())
	}
	if callErr("x", 0).(*CallError).Errno == 0 {
		t.Fatal("errno 0 kept")
	}
}

// TestNotAvailable checks the path taken on machines without rdma-core or
// without a device: clean errors wrapping ErrNoRDMA and an empty list.
func TestNotAvailable(t *testing.T) {
	if _, err := Open("tensorferry-no-such-device"); !errors.Is(err, ErrNoRDMA) {
		t.Fatalf("Open(unknown) = %v, want ErrNoRDMA", err)
	}
	err := Available()
	devs, derr := Devices()
	if err == nil {
		if derr != nil || len(devs) == 0 {
			t.Fatalf("Available() nil but Devices() = %v, %v", devs, derr)
		}
		t.Logf("RDMA available: %d device(s)", len(devs))
		return
	}
	if !errors.Is(err, ErrNoRDMA) {
		t.Fatalf("Available() = %v, want ErrNoRDMA", err)
	}
	if devs == nil || len(devs) != 0 {
		t.Fatalf("Devices() = %v, want an empty list", devs)
	}
	if derr != nil && !errors.Is(derr, ErrNoRDMA) {
		t.Fatalf("Devices() error %v does not wrap ErrNoRDMA", derr)
	}
	t.Logf("not available (expected here): %v", err)
}

// rig is one device context with a PD, a CQ and the first usable port.
type rig struct {
	ctx  *Context
	pd   *PD
	cq   *CQ
	port PortInfo
}

func newRig(t *testing.T) *rig {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("no RDMA device: %v", err)
	}
	devs, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Err != nil {
			t.Logf("device %s: %v", d.Name, d.Err)
			continue
		}
		for _, p := range d.Ports {
			t.Logf("device %s GUID %#x port %d: %s %s MTU %s LID %d RoCEv2 IPv4 GID index %d, %d GIDs",
				d.Name, d.GUID, p.Num, p.State, p.LinkLayer, p.ActiveMTU, p.LID, p.RoCEv2IPv4, len(p.GIDs))
			if !p.Usable() {
				continue
			}
			r := &rig{port: p}
			if r.ctx, err = Open(d.Name); err != nil {
				t.Fatal(err)
			}
			if r.pd, err = r.ctx.AllocPD(); err != nil {
				t.Fatal(err)
			}
			if r.cq, err = r.ctx.CreateCQ(256); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, c := range []func() error{r.cq.Close, r.pd.Close, r.ctx.Close} {
					if err := c(); err != nil {
						t.Errorf("cleanup: %v", err)
					}
				}
			})
			return r
		}
	}
	t.Skip("no usable RDMA port")
	return nil
}

// pair creates two RC QPs on the rig connected to each other (loopback).
func (r *rig) pair(t *testing.T) (reader, owner *QP) {
	t.Helper()
	var err error
	if reader, err = r.pd.CreateRCQP(r.cq, QPCaps{MaxSendWR: 64}); err != nil {
		t.Fatal(err)
	}
	if owner, err = r.pd.CreateRCQP(r.cq, QPCaps{MaxSendWR: 64}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range []*QP{reader, owner} {
			if err := q.Close(); err != nil {
				t.Errorf("QP close: %v", err)
			}
		}
	})
	re := reader.LocalEndpoint(r.port, 0x1234)
	oe := owner.LocalEndpoint(r.port, 0x5678)
	if err := reader.Connect(r.port, 0, oe, re.PSN, ConnectOptions{Timeout: 12, RetryCount: 3}); err != nil {
		t.Fatal(err)
	}
	if err := owner.Connect(r.port, AccessRemoteRead, re, oe.PSN, ConnectOptions{Timeout: 12, RetryCount: 3}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*QP{reader, owner} {
		if s, err := q.State(); err != nil || s != QPRTS {
			t.Fatalf("QP %d state %v, %v; want RTS", q.QPN(), s, err)
		}
	}
	return reader, owner
}

// wait polls cq until n completions arrived or the timeout passed; it
// returns the first completion error.
func wait(t *testing.T, cq *CQ, n int, timeout time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wcs := make([]WorkCompletion, 16)
	var first error
	for got := 0; got < n; {
		k, err := cq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:k] {
			if err := wc.Err(); err != nil && first == nil {
				first = err
			}
		}
		got += k
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d completions after %v", got, n, timeout)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return first
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestLoopbackRead(t *testing.T) {
	r := newRig(t)
	reader, _ := r.pair(t)
	const size, chunk = 1 << 20, 64 << 10
	src := make([]byte, size)
	dst := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	smr, err := r.pd.RegMR(addr(src), size, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Close()
	dmr, err := r.pd.RegMR(addr(dst), size, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	start := time.Now()
	// Two batches of 8 outstanding reads.
	for batch := 0; batch < size/chunk; batch += 8 {
		reqs := make([]ReadRequest, 8)
		for i := range reqs {
			off := (batch + i) * chunk
			reqs[i] = ReadRequest{WRID: uint64(batch + i), LocalAddr: uintptr(dmr.Addr()) + uintptr(off), LKey: dmr.LKey(),
				Length: chunk, RemoteAddr: smr.Addr() + uint64(off), RKey: smr.RKey(), Signaled: true}
		}
		if err := reader.PostReads(reqs); err != nil {
			t.Fatal(err)
		}
		if err := wait(t, r.cq, len(reqs), 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	if !bytes.Equal(src, dst) {
		t.Fatal("RDMA READ returned different bytes")
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	t.Logf("read %d bytes in %v (%.1f MB/s)", size, el, float64(size)/el.Seconds()/1e6)
}

func TestReadWrongRKeyFails(t *testing.T) {
	r := newRig(t)
	reader, _ := r.pair(t)
	src := make([]byte, 4096)
	dst := make([]byte, 4096)
	smr, err := r.pd.RegMR(addr(src), len(src), AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Close()
	dmr, err := r.pd.RegMR(addr(dst), len(dst), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	err = reader.PostReads([]ReadRequest{{WRID: 42, LocalAddr: uintptr(dmr.Addr()), LKey: dmr.LKey(), Length: 4096,
		RemoteAddr: smr.Addr(), RKey: smr.RKey() ^ 0x5a5a00, Signaled: true}})
	if err != nil {
		t.Fatal(err)
	}
	err = wait(t, r.cq, 1, 30*time.Second)
	var wce *WCError
	if !errors.As(err, &wce) || wce.WRID != 42 {
		t.Fatalf("wrong rkey: got %v, want a WCError for WR 42", err)
	}
	t.Logf("wrong rkey: %v", err)
	if s, _ := reader.State(); s != QPError {
		t.Errorf("QP state after failed read: %v, want ERR", s)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

func TestReadAfterDeregFails(t *testing.T) {
	r := newRig(t)
	reader, _ := r.pair(t)
	src := make([]byte, 4096)
	dst := make([]byte, 4096)
	smr, err := r.pd.RegMR(addr(src), len(src), AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	dmr, err := r.pd.RegMR(addr(dst), len(dst), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	raddr, rkey := smr.Addr(), smr.RKey()
	if err := smr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := smr.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	if err := reader.PostReads([]ReadRequest{{WRID: 9, LocalAddr: uintptr(dmr.Addr()), LKey: dmr.LKey(), Length: 4096,
		RemoteAddr: raddr, RKey: rkey, Signaled: true}}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, r.cq, 1, 30*time.Second); err == nil {
		t.Fatal("read through a deregistered rkey succeeded")
	} else {
		t.Logf("stale rkey: %v", err)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

func TestQPTransitionErrorNamesTransition(t *testing.T) {
	r := newRig(t)
	qp, err := r.pd.CreateRCQP(r.cq, QPCaps{})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	err = qp.ReadyToSend(1, ConnectOptions{})
	if err == nil || !strings.Contains(err.Error(), "RESET->RTS") {
		t.Fatalf("RESET->RTS: got %v, want an error naming the transition", err)
	}
	if err := qp.Init(r.port.Num, AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if err := qp.SetError(); err != nil {
		t.Fatal(err)
	}
	if s, err := qp.State(); err != nil || s != QPError {
		t.Fatalf("state after SetError: %v, %v", s, err)
	}
}

func TestRegMRBadInput(t *testing.T) {
	r := newRig(t)
	if _, err := r.pd.RegMR(0, 4096, AccessLocalWrite); err == nil {
		t.Fatal("RegMR(nil) succeeded")
	}
	b := make([]byte, 8)
	if _, err := r.pd.RegMR(addr(b), 0, AccessLocalWrite); err == nil {
		t.Fatal("RegMR(0 bytes) succeeded")
	}
	if _, err := r.pd.RegDmabufMR(0, 4096, 0, -1, AccessRemoteRead); err == nil {
		t.Fatal("RegDmabufMR(fd -1) succeeded")
	}
}

// TestReadFromDestroyedQPFails destroys the responder's queue pair while
// reads are outstanding: the reads must complete with an error (retry
// exceeded) rather than hang.
func TestReadFromDestroyedQPFails(t *testing.T) {
	r := newRig(t)
	reader, err := r.pd.CreateRCQP(r.cq, QPCaps{MaxSendWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	owner, err := r.pd.CreateRCQP(r.cq, QPCaps{MaxSendWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	re := reader.LocalEndpoint(r.port, 1)
	oe := owner.LocalEndpoint(r.port, 2)
	opts := ConnectOptions{Timeout: 12, RetryCount: 3}
	if err := reader.Connect(r.port, 0, oe, re.PSN, opts); err != nil {
		t.Fatal(err)
	}
	if err := owner.Connect(r.port, AccessRemoteRead, re, oe.PSN, opts); err != nil {
		t.Fatal(err)
	}
	const size, chunk = 16 << 20, 1 << 20
	src := make([]byte, size)
	dst := make([]byte, size)
	smr, err := r.pd.RegMR(addr(src), size, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Close()
	dmr, err := r.pd.RegMR(addr(dst), size, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	reqs := make([]ReadRequest, size/chunk)
	for i := range reqs {
		off := i * chunk
		reqs[i] = ReadRequest{WRID: uint64(i), LocalAddr: uintptr(dmr.Addr()) + uintptr(off), LKey: dmr.LKey(),
			Length: chunk, RemoteAddr: smr.Addr() + uint64(off), RKey: smr.RKey(), Signaled: true}
	}
	if err := reader.PostReads(reqs); err != nil {
		t.Fatal(err)
	}
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = wait(t, r.cq, len(reqs), 60*time.Second)
	t.Logf("after destroying the responder: %v (%v)", err, time.Since(start))
	if err == nil {
		t.Log("all reads finished before the responder went away")
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

func TestIncRKey(t *testing.T) {
	for in, want := range map[uint32]uint32{0x1234_5600: 0x1234_5601, 0x1234_56ff: 0x1234_5600, 0xffff_fffe: 0xffff_ffff} {
		if got := IncRKey(in); got != want {
			t.Errorf("IncRKey(%#x) = %#x, want %#x", in, got, want)
		}
	}
	if !(DeviceAttr{CapFlags: DeviceMemWindowType2B}).MemoryWindowType2() || (DeviceAttr{CapFlags: DeviceMemWindow}).MemoryWindowType2() {
		t.Error("MemoryWindowType2 reads the wrong flag")
	}
}

// TestProbeWindows reports what the device does with type-2 windows: the
// probe's verdict is one of nil, ErrNoWindows or ErrWindowBounds.
func TestProbeWindows(t *testing.T) {
	r := newRig(t)
	attr, err := r.ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	err = ProbeWindows(r.ctx, r.port)
	t.Logf("%s: device_cap_flags %#x, window probe: %v", r.ctx.Name(), uint32(attr.CapFlags), err)
	if err != nil && !errors.Is(err, ErrNoWindows) && !errors.Is(err, ErrWindowBounds) {
		t.Fatalf("probe failed: %v", err)
	}
	if errors.Is(err, ErrNoWindows) == attr.MemoryWindowType2() {
		t.Fatalf("probe %v but MemoryWindowType2() = %v", err, attr.MemoryWindowType2())
	}
}

// TestMemoryWindowGrantsItsRange binds a type-2 window to the middle page of
// a region registered for binding only: it reads exactly that page, its
// rkey reads nothing after IBV_WR_LOCAL_INV, and a rebind of the same
// window gives a new rkey that reads again.
func TestMemoryWindowGrantsItsRange(t *testing.T) {
	r := newRig(t)
	if attr, err := r.ctx.QueryDevice(); err != nil {
		t.Fatal(err)
	} else if !attr.MemoryWindowType2() {
		t.Skipf("%s has no type-2 memory windows", r.ctx.Name())
	}
	const page = 4096
	src := make([]byte, 3*page)
	for i := range src {
		src[i] = byte(i * 13)
	}
	dst := make([]byte, page)
	mr, err := r.pd.RegMR(addr(src), len(src), AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	dmr, err := r.pd.RegMR(addr(dst), len(dst), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	mw, err := r.pd.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := mw.Close(); err != nil {
			t.Error(err)
		}
		if err := mw.Close(); !errors.Is(err, ErrClosed) {
			t.Errorf("second Close = %v, want ErrClosed", err)
		}
	}()
	reader, owner := r.pair(t)
	win := uint64(addr(src)) + page
	bindWait := func(wrid uint64) uint32 {
		rkey, err := owner.BindMW(wrid, mw, mr, win, page, AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, r.cq, 1, 30*time.Second); err != nil {
			t.Fatalf("bind: %v", err)
		}
		if mw.RKey() != rkey {
			t.Fatalf("RKey() = %#x after binding %#x", mw.RKey(), rkey)
		}
		return rkey
	}
	read := func(wrid uint64, rkey uint32) error {
		clear(dst)
		if err := reader.PostReads([]ReadRequest{{WRID: wrid, LocalAddr: addr(dst), LKey: dmr.LKey(), Length: page,
			RemoteAddr: win, RKey: rkey, Signaled: true}}); err != nil {
			t.Fatal(err)
		}
		return wait(t, r.cq, 1, 30*time.Second)
	}
	rkey := bindWait(1)
	if err := read(2, rkey); err != nil {
		t.Fatalf("read of the window: %v", err)
	}
	if !bytes.Equal(dst, src[page:2*page]) {
		t.Fatal("the window read other bytes")
	}
	if err := owner.LocalInvalidate(3, rkey); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, r.cq, 1, 30*time.Second); err != nil {
		t.Fatalf("invalidate: %v", err)
	}
	rkey2 := bindWait(4)
	if rkey2 == rkey {
		t.Fatalf("rebind kept rkey %#x", rkey)
	}
	if err := read(5, rkey2); err != nil {
		t.Fatalf("read after rebinding: %v", err)
	}
	// The first bind's rkey is stale: the read fails (and breaks the pair).
	if err := read(6, rkey); err == nil {
		t.Fatal("an invalidated window's rkey still reads")
	} else {
		t.Logf("stale window rkey: %v", err)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}
