package memory

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// fillPTX holds two kernels: fill (p[i] = v for i < n, one thread per
// element) and affine (x[i] = a*x[i] + b as float32, a grid-stride loop).
const fillPTX = `
// test kernels
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
	@%p1 bra FILL_DONE;
	shl.b64 %rd5, %rd3, 2;
	add.s64 %rd6, %rd1, %rd5;
	st.global.u32 [%rd6], %r1;
FILL_DONE:
	ret;
}

/* affine: x[i] = a*x[i] + (float)b */
.visible .entry affine(
	.param .u64 .ptr .global .align 4 affine_x,
	.param .f32 affine_a,
	.param .f64 affine_b,
	.param .u64 affine_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<5>;
	.reg .f32 %f<5>;
	.reg .f64 %fd<2>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [affine_x];
	ld.param.f32 %f1, [affine_a];
	ld.param.f64 %fd1, [affine_b];
	ld.param.u64 %rd2, [affine_n];
	cvta.to.global.u64 %rd1, %rd1;
	cvt.rn.f32.f64 %f2, %fd1;
	mov.u32 %r1, %ctaid.x;
	mov.u32 %r2, %ntid.x;
	mov.u32 %r3, %tid.x;
	mov.u32 %r4, %nctaid.x;
	mul.wide.u32 %rd3, %r1, %r2;
	cvt.u64.u32 %rd4, %r3;
	add.s64 %rd3, %rd3, %rd4;
	mul.wide.u32 %rd5, %r4, %r2;
AFFINE_LOOP:
	setp.ge.u64 %p1, %rd3, %rd2;
	@%p1 bra AFFINE_DONE;
	shl.b64 %rd6, %rd3, 2;
	add.s64 %rd7, %rd1, %rd6;
	ld.global.f32 %f3, [%rd7];
	fma.rn.f32 %f4, %f1, %f3, %f2;
	st.global.f32 [%rd7], %f4;
	add.s64 %rd3, %rd3, %rd5;
	bra AFFINE_LOOP;
AFFINE_DONE:
	ret;
}
`

func TestPTXEntries(t *testing.T) {
	got := ptxEntries(fillPTX + `
.entry noargs()
{
	ret;
}
.weak .entry bare
{
	ret;
}
.visible .entry structs(.param .align 8 .b8 s[16], .param .s32 k)
{ ret; }
.visible .entry odd(.param .u64 p, .reg .u32 bogus)
{ ret; }
// .visible .entry commented(.param .u64 p)
`)
	u64 := ptxParam{paramInt, 8, ".u64"}
	want := map[string][]ptxParam{
		"fill":    {u64, {paramInt, 4, ".u32"}, u64},
		"affine":  {u64, {paramFloat, 4, ".f32"}, {paramFloat, 8, ".f64"}, u64},
		"noargs":  {},
		"bare":    {},
		"structs": {{paramBits, 16, ".b8[16]"}, {paramInt, 4, ".s32"}},
		"odd":     nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ptxEntries:\n got %v\nwant %v", got, want)
	}
}

func TestIsPTX(t *testing.T) {
	for _, c := range []struct {
		image string
		want  bool
	}{
		{fillPTX, true},
		{"\x7fELF\x02\x01.version", false},
		{".version 7.0\x00", false},
		{"no version line", false},
		{"\xff.version", false},
	} {
		if got := isPTX([]byte(c.image)); got != c.want {
			t.Errorf("isPTX(%.20q) = %v, want %v", c.image, got, c.want)
		}
	}
}

func TestCheckArgs(t *testing.T) {
	params := ptxEntries(fillPTX)["affine"]
	dev, _ := WrapCUDA(CUDA(0), 0x1000, 16, nil)
	ok := []KernelArg{BufferArg(dev), Float32Arg(2), Float64Arg(1), Uint64Arg(4)}
	if err := checkArgs(params, ok); err != nil {
		t.Errorf("matching arguments: %v", err)
	}
	ints := []ptxParam{{paramInt, 8, ".s64"}, {paramInt, 4, ".s32"}, {paramInt, 4, ".u32"}}
	if err := checkArgs(ints, []KernelArg{Int64Arg(-2), Int32Arg(-1), Uint32Arg(7)}); err != nil {
		t.Errorf("integer arguments: %v", err)
	}
	bits := []ptxParam{{paramBits, 4, ".b32"}, {paramBits, 8, ".b64"}}
	if err := checkArgs(bits, []KernelArg{Float32Arg(1), BufferArg(dev)}); err != nil {
		t.Errorf(".b parameters take any value of their size: %v", err)
	}
	for _, c := range []struct {
		args []KernelArg
		want string
	}{
		{ok[:3], "3 arguments, the kernel has 4 parameters"},
		{[]KernelArg{BufferArg(dev), Float64Arg(2), Float64Arg(1), Uint64Arg(4)}, "argument 1 is a 64-bit float, parameter 1 is .f32"},
		{[]KernelArg{BufferArg(dev), Int32Arg(2), Float64Arg(1), Uint64Arg(4)}, "argument 1 is a 32-bit integer, parameter 1 is .f32"},
		{[]KernelArg{Float64Arg(0), Float32Arg(2), Float64Arg(1), Uint64Arg(4)}, "argument 0 is a 64-bit float, parameter 0 is .u64"},
		{[]KernelArg{BufferArg(dev), Float32Arg(2), Float64Arg(1), Uint32Arg(4)}, "argument 3 is a 32-bit integer, parameter 3 is .u64"},
		{[]KernelArg{{}, Float32Arg(2), Float64Arg(1), Uint64Arg(4)}, "argument 0 is invalid (the zero KernelArg), parameter 0 is .u64"},
	} {
		err := checkArgs(params, c.args)
		if err == nil || err.Error() != c.want {
			t.Errorf("checkArgs = %v, want %q", err, c.want)
		}
	}
}

func TestKernelArgBits(t *testing.T) {
	for _, c := range []struct {
		arg  KernelArg
		want uint64
	}{
		{Int32Arg(-1), 0xffffffff}, // the upper 4 bytes of the slot stay zero
		{Uint32Arg(7), 7},
		{Int64Arg(-2), 0xfffffffffffffffe},
		{Uint64Arg(1 << 40), 1 << 40},
		{Float32Arg(1), 0x3f800000},
		{Float64Arg(-2), 0xc000000000000000},
	} {
		if c.arg.bits != c.want {
			t.Errorf("%s: bits %#x, want %#x", c.arg.kindName(), c.arg.bits, c.want)
		}
	}
}

func TestLinear(t *testing.T) {
	for _, c := range []struct {
		n, block, maxGrid int
		want              LaunchConfig
	}{
		{0, 0, 0, LaunchConfig{Grid: Dim3{X: 1}, Block: Dim3{X: 256}}},
		{1000, 0, 0, LaunchConfig{Grid: Dim3{X: 4}, Block: Dim3{X: 256}}},
		{1 << 30, 0, 0, LaunchConfig{Grid: Dim3{X: 1 << 16}, Block: Dim3{X: 256}}},
		{1000, 128, 2, LaunchConfig{Grid: Dim3{X: 2}, Block: Dim3{X: 128}}},
		{1024, 0, 0, LaunchConfig{Grid: Dim3{X: 4}, Block: Dim3{X: 256}}},
		{math.MaxInt, 1, math.MaxInt, LaunchConfig{Grid: Dim3{X: math.MaxInt32}, Block: Dim3{X: 1}}},
	} {
		if got := Linear(c.n, c.block, c.maxGrid); got != c.want {
			t.Errorf("Linear(%d, %d, %d) = %+v, want %+v", c.n, c.block, c.maxGrid, got, c.want)
		}
	}
	if got := (Dim3{X: 3}).cuda(); got != (cuda.Dim3{X: 3, Y: 1, Z: 1}) {
		t.Errorf("Dim3{X: 3} = %+v for the driver", got)
	}
}

func TestFillHost(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{0, 1, 7, 4096, 100003} {
		b, err := NewHostBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := Fill(ctx, b, 0x3c); err != nil {
			t.Fatal(err)
		}
		for i, v := range b.Host() {
			if v != 0x3c {
				t.Fatalf("%d bytes: byte %d = %#x", n, i, v)
			}
		}
		if n > 2 {
			view, _ := b.Slice(1, n-2)
			if err := Fill(ctx, view, 0); err != nil {
				t.Fatal(err)
			}
			h := b.Host()
			if h[0] != 0x3c || h[1] != 0 || h[n-2] != 0 || h[n-1] != 0x3c {
				t.Fatalf("Fill of a view wrote outside it: %v ... %v", h[:2], h[n-2:])
			}
		}
		b.Free()
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Fill(cctx, WrapHost(make([]byte, 8)), 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Fill with a cancelled context: %v", err)
	}
}

func TestModuleOnHostFails(t *testing.T) {
	if _, err := LoadModule(CPU, []byte(fillPTX)); err == nil {
		t.Error("LoadModule on the CPU succeeded")
	}
	if _, err := CanAccessPeer(CPU, CUDA(0)); err == nil {
		t.Error("CanAccessPeer of the CPU succeeded")
	}
}

func TestGPUModuleLaunch(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	if _, err := LoadModule(CUDA(0), []byte(".version 7.0\n.target sm_70\nthis is not ptx")); err == nil {
		t.Error("loading bad PTX succeeded")
	} else {
		t.Logf("bad PTX: %v", err)
	}
	m, err := LoadModule(CUDA(0), []byte(fillPTX))
	if err != nil {
		t.Fatal(err)
	}
	if m.Device() != CUDA(0) {
		t.Errorf("Device = %s", m.Device())
	}
	fill, err := m.Function("fill")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := m.Function("fill"); again != fill || fill.Name() != "fill" {
		t.Errorf("Function(fill) twice: %p, %p (%s)", fill, again, fill.Name())
	}
	if _, err := m.Function("nope"); err == nil {
		t.Error("Function(nope) succeeded")
	}
	affine, err := m.Function("affine")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := AllocatorFor(CUDA(0))
	const n = 100003 // not a multiple of the block size
	buf, err := a.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := Fill(ctx, buf, 0xff); err != nil {
		t.Fatal(err)
	}
	s, err := NewStream(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// fill all but the last element with 2.0 on s, then x = 1.5x - 0.5 with
	// a grid smaller than the vector (the kernel loops), through Run.
	if err := fill.Launch(s, Linear(n-1, 0, 0), BufferArg(buf), Uint32Arg(math.Float32bits(2)), Uint64Arg(n-1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := affine.Run(ctx, Linear(n, 128, 7), BufferArg(buf), Float32Arg(1.5), Float64Arg(-0.5), Uint64Arg(n-1)); err != nil {
		t.Fatal(err)
	}
	host, _ := NewHostBuffer(4 * n)
	defer host.Free()
	if err := Copy(ctx, host, buf); err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*float32)(unsafe.Pointer(&host.Host()[0])), n)
	for i, v := range got[:n-1] {
		if v != 2.5 {
			t.Fatalf("x[%d] = %v, want 2.5", i, v)
		}
	}
	if b := math.Float32bits(got[n-1]); b != 0xffffffff {
		t.Errorf("x[n-1] = %#x, want the 0xff fill (n-1 elements only)", b)
	}

	// What Launch refuses before the driver sees it.
	hostArg := WrapHost(make([]byte, 16))
	for _, c := range []struct {
		name string
		cfg  LaunchConfig
		args []KernelArg
		want string
	}{
		{"no grid", LaunchConfig{Block: Dim3{X: 1}}, []KernelArg{BufferArg(buf), Uint32Arg(0), Uint64Arg(1)}, "empty launch shape"},
		{"host buffer", Linear(1, 0, 0), []KernelArg{BufferArg(hostArg), Uint32Arg(0), Uint64Arg(1)}, "a buffer on cpu"},
		{"nil buffer", Linear(1, 0, 0), []KernelArg{BufferArg(nil), Uint32Arg(0), Uint64Arg(1)}, "BufferArg(nil)"},
		{"float for u32", Linear(1, 0, 0), []KernelArg{BufferArg(buf), Float32Arg(0), Uint64Arg(1)}, "parameter 1 is .u32"},
		{"too few", Linear(1, 0, 0), []KernelArg{BufferArg(buf)}, "1 arguments, the kernel has 3"},
	} {
		if err := fill.Launch(s, c.cfg, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Launch = %v, want an error with %q", c.name, err, c.want)
		}
	}
	if err := fill.Launch(nil, Linear(1, 0, 0)); err == nil {
		t.Error("Launch on a nil stream succeeded")
	}
	if n, _ := CUDADeviceCount(); n > 1 {
		s1, err := NewStream(CUDA(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := fill.Launch(s1, Linear(1, 0, 0), BufferArg(buf), Uint32Arg(0), Uint64Arg(1)); err == nil {
			t.Error("Launch on a stream of another device succeeded")
		}
		s1.Close()
	}
	freed, _ := a.Alloc(16)
	freed.Free()
	if err := fill.Run(ctx, Linear(1, 0, 0), BufferArg(freed), Uint32Arg(0), Uint64Arg(1)); !errors.Is(err, ErrFreed) {
		t.Errorf("Run with a freed buffer: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fill.Run(ctx, Linear(1, 0, 0), BufferArg(buf), Uint32Arg(0), Uint64Arg(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	if _, err := m.Function("fill"); !errors.Is(err, ErrClosed) {
		t.Errorf("Function after Close: %v", err)
	}
	if err := m.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

func TestGPUTimingEvents(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	s, err := NewStream(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start, err := NewTimingEvent(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer start.Close()
	end, err := NewTimingEvent(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewEvent(CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	a, _ := AllocatorFor(CUDA(0))
	const n = 64 << 20
	x, _ := a.Alloc(n)
	defer x.Free()
	y, _ := a.Alloc(n)
	defer y.Free()
	if err := Fill(ctx, x, 9); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(start); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := s.CopyAsync(y, x); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(end); err != nil {
		t.Fatal(err)
	}
	if err := s.Record(plain); err != nil {
		t.Fatal(err)
	}
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	d, err := ElapsedTime(start, end)
	if err != nil {
		t.Fatal(err)
	}
	// 256 MiB copied within the device: more than a microsecond, less than
	// the 10 s that even a 30 GB/s device could not need.
	if d < time.Microsecond || d > 10*time.Second {
		t.Errorf("ElapsedTime = %v for 4 copies of 64 MiB", d)
	}
	t.Logf("4 x 64 MiB device to device in %v (%.0f GB/s)", d, 4*n/d.Seconds()/1e9)
	if _, err := ElapsedTime(start, plain); err == nil {
		t.Error("ElapsedTime with an event without timing succeeded")
	}
	if err := end.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ElapsedTime(start, end); !errors.Is(err, ErrClosed) {
		t.Errorf("ElapsedTime with a closed event: %v", err)
	}
}

func TestGPUFill(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	a, _ := AllocatorFor(CUDA(0))
	const n = 3<<20 + 5
	b, err := a.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := Fill(ctx, b, 0xa5); err != nil {
		t.Fatal(err)
	}
	mid, _ := b.Slice(1000, n-2000)
	if err := Fill(ctx, mid, 0); err != nil {
		t.Fatal(err)
	}
	h, _ := NewHostBuffer(n)
	defer h.Free()
	if err := Copy(ctx, h, b); err != nil {
		t.Fatal(err)
	}
	for i, v := range h.Host() {
		want := byte(0)
		if i < 1000 || i >= n-1000 {
			want = 0xa5
		}
		if v != want {
			t.Fatalf("byte %d = %#x, want %#x", i, v, want)
		}
	}
	freed, _ := a.Alloc(16)
	freed.Free()
	if err := Fill(ctx, freed, 1); !errors.Is(err, ErrFreed) {
		t.Errorf("Fill of a freed buffer: %v", err)
	}
}

func TestGPUCanAccessPeer(t *testing.T) {
	needGPU(t)
	if ok, err := CanAccessPeer(CUDA(0), CUDA(0)); err != nil || !ok {
		t.Errorf("CanAccessPeer(cuda:0, cuda:0) = %v, %v", ok, err)
	}
	if err := EnablePeerAccess(CUDA(0), CUDA(0)); err != nil {
		t.Errorf("EnablePeerAccess(cuda:0, cuda:0) = %v", err)
	}
	n, _ := CUDADeviceCount()
	if _, err := CanAccessPeer(CUDA(0), CUDA(n)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("CanAccessPeer(cuda:0, cuda:%d) of %d devices: %v", n, n, err)
	}
	if n < 2 {
		t.Skip("one GPU: no peer to ask about")
	}
	ab, err := CanAccessPeer(CUDA(0), CUDA(1))
	if err != nil {
		t.Fatal(err)
	}
	ba, err := CanAccessPeer(CUDA(1), CUDA(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cuda:0 -> cuda:1: %v; cuda:1 -> cuda:0: %v", ab, ba)
	err = EnablePeerAccess(CUDA(0), CUDA(1))
	if (ab && ba) != (err == nil) {
		t.Errorf("EnablePeerAccess = %v with CanAccessPeer %v, %v", err, ab, ba)
	}
	// Asking again gives the same answer (done once per pair).
	if err2 := EnablePeerAccess(CUDA(1), CUDA(0)); (err2 == nil) != (err == nil) {
		t.Errorf("EnablePeerAccess again = %v, first %v", err2, err)
	}
}

// FuzzPTXEntries: the parameter reader never panics, and what it reads is
// within the bounds Launch relies on.
func FuzzPTXEntries(f *testing.F) {
	f.Add(fillPTX)
	f.Add(".entry k(.param .align 8 .b8 s[65536], .param .u64 p)")
	f.Add(".entry k(.param .u64 .ptr .global .align")
	f.Add("/* .entry k( */ .entry j(// )\n.param .f32 x)")
	f.Fuzz(func(t *testing.T, ptx string) {
		for name, ps := range ptxEntries(ptx) {
			for _, p := range ps {
				if p.kind == 0 || p.size <= 0 || p.size > 8<<16 {
					t.Fatalf("entry %q: parameter %+v", name, p)
				}
			}
		}
	})
}
