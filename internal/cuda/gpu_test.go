package cuda

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

// gpu returns device 0's context, or skips the test with the reason.
func gpu(t *testing.T) *Context {
	t.Helper()
	if err := Init(); err != nil {
		if errors.Is(err, ErrNoDevice) {
			t.Skipf("no CUDA device: %v", err)
		}
		t.Fatalf("Init: %v", err)
	}
	c, err := Primary(0)
	if err != nil {
		t.Fatalf("Primary(0): %v", err)
	}
	return c
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestGPUDeviceQueries(t *testing.T) {
	gpu(t)
	n, err := DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	uuid, err := DeviceUUID(0)
	if err != nil || len(uuid) != 40 || uuid[:4] != "GPU-" {
		t.Errorf("DeviceUUID = %q, %v", uuid, err)
	}
	pci, err := DevicePCIBusID(0)
	if err != nil || len(pci) < 12 {
		t.Errorf("DevicePCIBusID = %q, %v", pci, err)
	}
	total, err := TotalMem(0)
	if err != nil || total < 1<<30 {
		t.Errorf("TotalMem = %d, %v", total, err)
	}
	if _, err := DeviceUUID(n); !errors.Is(err, ErrNoDevice) {
		t.Errorf("DeviceUUID(%d) = %v, want ErrNoDevice", n, err)
	}
	major, err := DeviceGetAttribute(AttrComputeCapabilityMajor, 0)
	if err != nil || major < 3 {
		t.Errorf("compute capability major = %d, %v", major, err)
	}
	t.Logf("%d device(s); 0: %s %s, %d MiB, sm_%d", n, uuid, pci, total>>20, major)
	c, _ := Primary(0)
	free, tot, err := c.MemGetInfo()
	if err != nil || free <= 0 || tot != total {
		t.Errorf("MemGetInfo = %d, %d, %v (TotalMem %d)", free, tot, err, total)
	}
}

func TestGPUCopies(t *testing.T) {
	c := gpu(t)
	const n = 3<<20 + 123
	src := randomBytes(n, 1)
	d1, err := c.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer c.MemFree(d1)
	d2, err := c.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer c.MemFree(d2)

	base, size, err := c.MemGetAddressRange(d1 + 1000)
	if err != nil || base != d1 || size < n {
		t.Errorf("MemGetAddressRange = %#x, %d, %v; want %#x, >= %d", base, size, err, d1, n)
	}

	// Synchronous: Go memory both ways.
	if err := c.MemcpyHtoD(d1, unsafe.Pointer(&src[0]), n); err != nil {
		t.Fatal(err)
	}
	// The default stream orders the memset before the synchronous copy.
	if err := c.MemsetD8Async(d2, 0xAB, n, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyDtoD(d2, d1, n); err != nil {
		t.Fatal(err)
	}
	got := bytes.Repeat([]byte{0x5A}, n)
	if err := c.MemcpyDtoH(unsafe.Pointer(&got[0]), d2, n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("sync HtoD/DtoD/DtoH round trip differs")
	}

	// Asynchronous through pinned memory on a stream.
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	pin, err := c.MemHostAlloc(n, HostAllocPortable|HostAllocDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	defer c.MemFreeHost(pin)
	pb := unsafe.Slice((*byte)(pin), n)
	src2 := randomBytes(n, 2)
	copy(pb, src2)
	if err := c.MemcpyHtoDAsync(d1, pin, n, s); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyDtoDAsync(d2, d1, n, s); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyPeerAsync(d1, c, d2, c, n, s); err != nil {
		t.Fatal(err)
	}
	clear(pb)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyDtoHAsync(pin, d1, n, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pb, src2) {
		t.Fatal("async pinned round trip differs")
	}

	// Wait variants with Go memory.
	src3 := randomBytes(n, 3)
	if err := c.MemcpyHtoDWait(d2, unsafe.Pointer(&src3[0]), n, s); err != nil {
		t.Fatal(err)
	}
	clear(got)
	if err := c.MemcpyDtoHWait(unsafe.Pointer(&got[0]), d2, n, s); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src3) {
		t.Fatal("wait-variant round trip differs")
	}

	// Registered Go memory, asynchronously.
	reg := randomBytes(n, 4)
	addr := uintptr(unsafe.Pointer(&reg[0]))
	if err := c.MemHostRegister(addr, n, HostRegisterPortable); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyHtoDAsync(d1, unsafe.Pointer(&reg[0]), n, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.MemHostUnregister(addr); err != nil {
		t.Fatal(err)
	}
	if err := c.MemcpyDtoH(unsafe.Pointer(&got[0]), d1, n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, reg) {
		t.Fatal("registered-memory copy differs")
	}
}

func TestGPUErrorsFromDriver(t *testing.T) {
	c := gpu(t)
	err := c.MemHostUnregister(0x1000)
	var e *Error
	if !errors.As(err, &e) || e.Call != "cuMemHostUnregister" || e.Name == "" {
		t.Fatalf("unregistering an unregistered address: %v", err)
	}
	t.Logf("driver error: %v", err)
	if _, err := c.MemAlloc(1 << 62); !errors.As(err, &e) || e.Code != ErrorOutOfMemory {
		t.Errorf("MemAlloc(1<<62) = %v, want CUDA_ERROR_OUT_OF_MEMORY", err)
	}
}

func TestGPUStreamsAndEvents(t *testing.T) {
	c := gpu(t)
	s1, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Destroy()
	s2, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Destroy()
	start, err := c.NewEvent(EventDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer start.Destroy()
	end, err := c.NewEvent(EventDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer end.Destroy()
	const n = 64 << 20
	a, _ := c.MemAlloc(n)
	defer c.MemFree(a)
	b, _ := c.MemAlloc(n)
	defer c.MemFree(b)
	if err := c.MemsetD8Async(a, 7, n, s1); err != nil {
		t.Fatal(err)
	}
	if err := start.Record(s1); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := c.MemcpyDtoDAsync(b, a, n, s1); err != nil {
			t.Fatal(err)
		}
	}
	if err := end.Record(s1); err != nil {
		t.Fatal(err)
	}
	// s2 copies b back to host only after s1's copies.
	if err := s2.WaitEvent(end); err != nil {
		t.Fatal(err)
	}
	pin, _ := c.MemHostAlloc(n, HostAllocPortable)
	defer c.MemFreeHost(pin)
	if err := c.MemcpyDtoHAsync(pin, b, n, s2); err != nil {
		t.Fatal(err)
	}
	if err := s2.Synchronize(); err != nil {
		t.Fatal(err)
	}
	done, err := end.Query()
	if err != nil || !done {
		t.Errorf("Query after the waiting stream finished = %v, %v", done, err)
	}
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	ms, err := ElapsedTime(start, end)
	if err != nil || ms <= 0 {
		t.Errorf("ElapsedTime = %v, %v", ms, err)
	}
	t.Logf("4 x 64 MiB DtoD in %.3f ms (%.0f GB/s)", ms, 4*n/float64(ms)/1e6)
	pb := unsafe.Slice((*byte)(pin), n)
	if pb[0] != 7 || pb[n-1] != 7 {
		t.Errorf("copied bytes %d..%d, want 7", pb[0], pb[n-1])
	}
	if err := s1.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := s1.Destroy(); !errors.Is(err, ErrDestroyed) {
		t.Errorf("second Destroy = %v", err)
	}
}

func TestGPUConcurrentGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := gpu(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				n := 4096 + g*100 + i
				src := randomBytes(n, uint64(g*1000+i))
				p, err := c.MemAlloc(n)
				if err != nil {
					errs <- err
					return
				}
				got := make([]byte, n)
				err = c.MemcpyHtoD(p, unsafe.Pointer(&src[0]), n)
				if err == nil {
					err = c.MemcpyDtoH(unsafe.Pointer(&got[0]), p, n)
				}
				if ferr := c.MemFree(p); err == nil {
					err = ferr
				}
				if err == nil && !bytes.Equal(got, src) {
					err = errors.New("data differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestGPUIpcHandle(t *testing.T) {
	c := gpu(t)
	p, err := c.MemAlloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.MemFree(p)
	h, err := c.IpcGetMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	if h == (IpcMemHandle{}) {
		t.Error("IPC handle is all zero")
	}
	h2, err := c.IpcGetMemHandle(p)
	if err != nil || h2 != h {
		t.Errorf("second IpcGetMemHandle differs or failed: %v", err)
	}
	// Opening one's own handle is refused by the driver in the same process.
	if q, err := c.IpcOpenMemHandle(h, IpcLazyEnablePeerAccess); err == nil {
		c.IpcCloseMemHandle(q)
		t.Log("driver opened an IPC handle in the exporting process")
	} else {
		t.Logf("opening in the same process: %v", err)
	}
}

// fillPTX writes v into p[0..n).
const fillPTX = `
.version 7.0
.target sm_70
.address_size 64

.visible .entry fill(.param .u64 p, .param .u32 v, .param .u64 n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [p];
	ld.param.u32 %r1, [v];
	ld.param.u64 %rd2, [n];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mul.wide.u32 %rd3, %r2, %r3;
	cvt.u64.u32 %rd4, %r4;
	add.s64 %rd3, %rd3, %rd4;
	setp.ge.u64 %p1, %rd3, %rd2;
	@%p1 bra DONE;
	shl.b64 %rd5, %rd3, 2;
	add.s64 %rd6, %rd1, %rd5;
	st.global.u32 [%rd6], %r1;
DONE:
	ret;
}
`

func TestGPUModuleLaunch(t *testing.T) {
	c := gpu(t)
	m, err := c.ModuleLoadData([]byte(fillPTX))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	f, err := m.Function("fill")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Function("nope"); err == nil {
		t.Error("Function(nope) succeeded")
	}
	const n = 1000
	p, _ := c.MemAlloc(4 * n)
	defer c.MemFree(p)
	s, _ := c.NewStream()
	defer s.Destroy()
	if err := c.MemsetD8Async(p, 0, 4*n, s); err != nil {
		t.Fatal(err)
	}
	err = c.LaunchKernel(f, Dim3{X: (n + 255) / 256, Y: 1, Z: 1}, Dim3{X: 256, Y: 1, Z: 1}, 0, s,
		ArgPtr(p), ArgInt32(0x01020304), ArgUint64(n-1))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]uint32, n)
	if err := c.MemcpyDtoH(unsafe.Pointer(&got[0]), p, 4*n); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		want := uint32(0x01020304)
		if i == n-1 {
			want = 0
		}
		if v != want {
			t.Fatalf("p[%d] = %#x, want %#x", i, v, want)
		}
	}
	if _, err := c.ModuleLoadData([]byte("this is not ptx")); err == nil {
		t.Error("loading garbage PTX succeeded")
	} else {
		t.Logf("bad PTX: %v", err)
	}
}

func TestGPUDmaBuf(t *testing.T) {
	c := gpu(t)
	ok, err := DeviceGetAttribute(AttrDmaBufSupported, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ok == 0 {
		t.Skip("device 0 does not support dmabuf export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)")
	}
	const n = 4 << 20
	p, err := c.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer c.MemFree(p)
	fd, err := c.MemGetHandleForAddressRange(p, n)
	if err != nil {
		t.Fatal(err)
	}
	if fd < 0 {
		t.Fatalf("fd = %d", fd)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Errorf("fstat dmabuf fd: %v", err)
	}
	if err := syscall.Close(fd); err != nil {
		t.Error(err)
	}
}

func TestGPUPeer(t *testing.T) {
	c0 := gpu(t)
	n, _ := DeviceCount()
	if n < 2 {
		t.Skipf("peer copies need 2 devices, have %d", n)
	}
	c1, err := Primary(1)
	if err != nil {
		t.Fatal(err)
	}
	can, err := CanAccessPeer(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if can {
		if err := c0.EnablePeerAccess(c1); err != nil {
			t.Fatal(err)
		}
		if err := c0.EnablePeerAccess(c1); err != nil {
			t.Fatalf("enabling twice: %v", err)
		}
	}
	const size = 8 << 20
	src := randomBytes(size, 9)
	a, _ := c0.MemAlloc(size)
	defer c0.MemFree(a)
	b, _ := c1.MemAlloc(size)
	defer c1.MemFree(b)
	if err := c0.MemcpyHtoD(a, unsafe.Pointer(&src[0]), size); err != nil {
		t.Fatal(err)
	}
	s, _ := c1.NewStream()
	defer s.Destroy()
	if err := c1.MemcpyPeerAsync(b, c1, a, c0, size, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := c1.MemcpyDtoH(unsafe.Pointer(&got[0]), b, size); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("peer copy differs")
	}
}
