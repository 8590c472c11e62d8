package memory_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tensorferry/tensorferry/memory"
)

// These examples run a GPU when there is one and do the same work on the
// host when there is none, so their output is the same on every machine.

// scalePTX is one kernel, x[i] *= a for i < n, as nvcc emits it for
//
//	extern "C" __global__ void scale(float *x, float a, unsigned long long n) {
//		for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//		     i < n; i += (unsigned long long)gridDim.x * blockDim.x)
//			x[i] = x[i] * a;
//	}
const scalePTX = `
.version 7.0
.target sm_70
.address_size 64

.visible .entry scale(.param .u64 x, .param .f32 a, .param .u64 n)
{
	.reg .pred %p<2>;
	.reg .f32 %f<3>;
	.reg .b32 %r<5>;
	.reg .b64 %rd<9>;

	ld.param.u64 %rd1, [x];
	ld.param.f32 %f1, [a];
	ld.param.u64 %rd3, [n];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r1, %ctaid.x;
	mov.u32 %r2, %ntid.x;
	mov.u32 %r3, %tid.x;
	mov.u32 %r4, %nctaid.x;
	cvt.u64.u32 %rd5, %r3;
	mad.wide.u32 %rd4, %r1, %r2, %rd5;
	mul.wide.u32 %rd6, %r4, %r2;
LOOP:
	setp.ge.u64 %p1, %rd4, %rd3;
	@%p1 bra DONE;
	shl.b64 %rd7, %rd4, 2;
	add.s64 %rd8, %rd1, %rd7;
	ld.global.f32 %f2, [%rd8];
	mul.rn.f32 %f2, %f2, %f1;
	st.global.f32 [%rd8], %f2;
	add.s64 %rd4, %rd4, %rd6;
	bra LOOP;
DONE:
	ret;
}
`

func float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func bytesFloat32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// A program ships its kernels as PTX, loads them once per device and
// launches them on device buffers; Run waits for the kernel as Copy waits
// for a copy.
func ExampleLoadModule() {
	ctx := context.Background()
	vals := []float32{1, 2, 3, 4}
	dev := memory.CUDA(0)
	mod, err := memory.LoadModule(dev, []byte(scalePTX))
	if errors.Is(err, memory.ErrNotSupported) {
		for i := range vals { // no GPU here: the same math on the host
			vals[i] *= 2
		}
		fmt.Println(vals)
		return
	} else if err != nil {
		fmt.Println(err)
		return
	}
	defer mod.Close()
	scale, err := mod.Function("scale")
	if err != nil {
		fmt.Println(err)
		return
	}
	x, err := memory.AllocUninit(dev, 4*len(vals))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer x.Free()
	host := memory.WrapHost(float32Bytes(vals))
	err = errors.Join(
		memory.Copy(ctx, x, host),
		scale.Run(ctx, memory.Linear(len(vals), 0, 0),
			memory.BufferArg(x), memory.Float32Arg(2), memory.Uint64Arg(uint64(len(vals)))),
		memory.Copy(ctx, host, x))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(bytesFloat32(host.Host()))
	// Output: [2 4 6 8]
}

// A Stream queues copies (and kernels) in order without waiting for each;
// an Event recorded after them says when they are done.
func ExampleNewStream() {
	ctx := context.Background()
	src := memory.WrapHost([]byte("through the device"))
	dst := memory.WrapHost(make([]byte, src.Len()))
	dev := memory.CUDA(0)
	s, err := memory.NewStream(dev)
	if errors.Is(err, memory.ErrNotSupported) {
		_ = memory.Copy(ctx, dst, src) // no GPU here: a host copy
		fmt.Printf("%s\n", dst.Host())
		return
	} else if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	done, err := memory.NewEvent(dev)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done.Close()
	gpu, err := memory.AllocUninit(dev, src.Len())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gpu.Free()
	err = errors.Join(s.CopyAsync(gpu, src), s.CopyAsync(dst, gpu), s.Record(done), done.Synchronize())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", dst.Host())
	// Output: through the device
}

// Timing events measure device time: how long the work queued between them
// took on the GPU, without the host's launch overhead.
func ExampleElapsedTime() {
	ctx := context.Background()
	const n = 1 << 20
	dev := memory.CUDA(0)
	start, err := memory.NewTimingEvent(dev)
	if errors.Is(err, memory.ErrNotSupported) {
		dev = memory.CPU // no GPU here: an untimed host copy
	} else if err != nil {
		fmt.Println(err)
		return
	}
	a, _ := memory.AllocUninit(dev, n)
	defer a.Free()
	b, _ := memory.AllocUninit(dev, n)
	defer b.Free()
	if err := memory.Fill(ctx, a, 1); err != nil {
		fmt.Println(err)
		return
	}
	if dev.IsHost() {
		err = memory.Copy(ctx, b, a)
	} else {
		defer start.Close()
		end, _ := memory.NewTimingEvent(dev)
		defer end.Close()
		s, _ := memory.NewStream(dev)
		defer s.Close()
		err = errors.Join(s.Record(start), s.CopyAsync(b, a), s.Record(end), end.Synchronize())
		if err == nil {
			// d is the copy's device time: n/d.Seconds() its bandwidth.
			if d, terr := memory.ElapsedTime(start, end); terr != nil || d <= 0 {
				err = fmt.Errorf("no device time: %v, %v", d, terr)
			}
		}
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	last, _ := b.Slice(n-1, 1)
	got := make([]byte, 1)
	_ = memory.Copy(ctx, memory.WrapHost(got), last)
	fmt.Println("copied 1 MiB of", got[0])
	// Output: copied 1 MiB of 1
}
