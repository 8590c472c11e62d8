package memory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// MaxKernelArgs is the most arguments one launch passes.
const MaxKernelArgs = cuda.MaxKernelArgs

// Module is a CUDA module, PTX text or a cubin or fatbin image, loaded on
// one device: the kernels a program ships with it (see LoadModule). It is
// safe for concurrent use; Close must come after the last launch.
type Module struct {
	d *cudaDevice

	mu     sync.RWMutex // Close takes it exclusively
	m      *cuda.Module // nil once closed
	params map[string][]ptxParam
	fns    map[string]*Function
}

// LoadModule loads a module on a CUDA device. PTX text is JIT-compiled by
// the driver for the device at hand (PTX for sm_70 runs on every later
// architecture); a compile error carries the JIT log. The image is copied:
// the caller may reuse it. It returns an error matching ErrNotSupported
// without a usable device.
//
// For PTX, LoadModule reads each entry's parameter list, and launches of its
// kernels check the number, size and class of their arguments against it
// (the driver itself cannot, and a mismatch would hand the kernel garbage).
// Kernels of binary images are launched unchecked.
//
// A module stays loaded until Close; loading is slow (a JIT compile), so a
// program loads its module once per device and keeps it.
func LoadModule(dev Device, image []byte) (*Module, error) {
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return nil, err
	}
	var params map[string][]ptxParam
	if isPTX(image) {
		params = ptxEntries(string(image))
	}
	m, err := d.ctx.ModuleLoadData(image)
	if err != nil {
		return nil, fmt.Errorf("memory: %s: loading a module: %w", dev, err)
	}
	return &Module{d: d, m: m, params: params, fns: map[string]*Function{}}, nil
}

// Device returns the device the module is loaded on.
func (m *Module) Device() Device { return m.d.dev }

// Function returns the kernel called name (its entry name: extern "C"
// kernels keep their C name, others have a mangled one).
func (m *Module) Function(name string) (*Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return nil, ErrClosed
	}
	if f, ok := m.fns[name]; ok {
		return f, nil
	}
	cf, err := m.m.Function(name)
	if err != nil {
		return nil, fmt.Errorf("memory: %s: %w", m.d.dev, err)
	}
	f := &Function{mod: m, f: cf, name: name}
	if m.params != nil {
		f.params = m.params[name]
	}
	m.fns[name] = f
	return f, nil
}

// Close unloads the module; its Functions fail with ErrClosed afterwards.
// Kernels launched from it must have completed.
func (m *Module) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return ErrClosed
	}
	err := m.m.Unload()
	m.m, m.fns = nil, nil
	if err != nil {
		return fmt.Errorf("memory: %s: %w", m.d.dev, err)
	}
	return nil
}

// Function is a kernel of a Module, valid until the module is closed. It
// is safe for concurrent use.
type Function struct {
	mod    *Module
	f      *cuda.Function
	name   string
	params []ptxParam // nil: unknown, launches are not checked
}

// Name returns the kernel's entry name.
func (f *Function) Name() string { return f.name }

// Dim3 is the shape of a grid (in blocks) or of a block (in threads). A Y or
// Z of 0 counts as 1, so Dim3{X: 256} is a one-dimensional shape; X must
// not be 0.
type Dim3 struct{ X, Y, Z uint32 }

func (d Dim3) cuda() cuda.Dim3 { return cuda.Dim3{X: d.X, Y: max(d.Y, 1), Z: max(d.Z, 1)} }

// LaunchConfig is the shape of one kernel launch.
type LaunchConfig struct {
	Grid  Dim3 // blocks in the grid
	Block Dim3 // threads per block (at most 1024 in all on current GPUs)
	// SharedMem is the dynamic shared memory per block, in bytes (default 0:
	// none beyond what the kernel declares statically).
	SharedMem uint32
}

// Linear returns the launch shape of a grid-stride loop over n elements:
// blocks of block threads (256 when block is 0), as many blocks as n needs
// up to maxGrid (65536 when maxGrid is 0); the kernel loops for the rest.
func Linear(n, block, maxGrid int) LaunchConfig {
	if block <= 0 {
		block = 256
	}
	if maxGrid <= 0 {
		maxGrid = 1 << 16
	}
	grid := n / block
	if n%block != 0 || grid == 0 {
		grid++
	}
	// 2^31-1 blocks is CUDA's limit on grid X; blocks are far smaller.
	grid, block = min(grid, maxGrid, math.MaxInt32), min(block, math.MaxInt32)
	return LaunchConfig{Grid: Dim3{X: uint32(grid)}, Block: Dim3{X: uint32(block)}}
}

// KernelArg is one kernel argument, passed by value: a device buffer's
// address (BufferArg) or a scalar. Make one with the functions below; the
// zero KernelArg is invalid.
type KernelArg struct {
	kind paramKind
	size int    // bytes: 4 or 8
	bits uint64 // the scalar, little-endian in the low size bytes
	buf  Buffer // BufferArg: the address is taken at launch
	ptr  bool   // made by BufferArg
}

// BufferArg passes the device address of buf, which must be CUDA memory on
// the launching device (a .u64 parameter: a pointer). The buffer must stay
// allocated until the kernel has completed.
func BufferArg(buf Buffer) KernelArg { return KernelArg{kind: paramInt, size: 8, buf: buf, ptr: true} }

// Float32Arg passes a float (a .f32 parameter).
func Float32Arg(v float32) KernelArg {
	return KernelArg{kind: paramFloat, size: 4, bits: uint64(math.Float32bits(v))}
}

// Float64Arg passes a double (a .f64 parameter).
func Float64Arg(v float64) KernelArg {
	return KernelArg{kind: paramFloat, size: 8, bits: math.Float64bits(v)}
}

// Int32Arg passes a 32-bit integer (a .s32 or .u32 parameter).
func Int32Arg(v int32) KernelArg { return KernelArg{kind: paramInt, size: 4, bits: uint64(uint32(v))} }

// Uint32Arg passes an unsigned 32-bit integer (a .u32 or .s32 parameter).
func Uint32Arg(v uint32) KernelArg { return KernelArg{kind: paramInt, size: 4, bits: uint64(v)} }

// Int64Arg passes a 64-bit integer (a .s64 or .u64 parameter).
func Int64Arg(v int64) KernelArg { return KernelArg{kind: paramInt, size: 8, bits: uint64(v)} }

// Uint64Arg passes an unsigned 64-bit integer (a .u64 or .s64 parameter),
// such as an element count.
func Uint64Arg(v uint64) KernelArg { return KernelArg{kind: paramInt, size: 8, bits: v} }

func (a KernelArg) kindName() string {
	switch {
	case a.ptr:
		return "a buffer"
	case a.kind == paramFloat:
		return fmt.Sprintf("a %d-bit float", 8*a.size)
	case a.kind == paramInt:
		return fmt.Sprintf("a %d-bit integer", 8*a.size)
	}
	return "invalid (the zero KernelArg)"
}

// Launch enqueues the kernel on s, a stream of the module's device, and
// returns once it is queued: it runs after the work already on s, and
// Stream.Synchronize or an Event recorded after it tells when it is done.
// The buffers passed must stay allocated (and are not to be reused) until
// then.
//
// Launch checks what it can before the driver sees the launch: the stream's
// device, the shape, every argument (buffers on the launching device and
// not freed) and, for PTX modules, the arguments against the kernel's
// parameters. Launch errors of the kernel itself (an illegal address) show
// up at the next synchronization of the stream.
func (f *Function) Launch(s *Stream, cfg LaunchConfig, args ...KernelArg) error {
	if s == nil {
		return fmt.Errorf("memory: kernel %s: nil stream", f.name)
	}
	if s.d != f.mod.d {
		return fmt.Errorf("memory: kernel %s is loaded on %s, the stream is on %s", f.name, f.mod.d.dev, s.d.dev)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return ErrClosed
	}
	return f.launch(s.s, cfg, args)
}

// Run launches the kernel on a stream of the package's own and waits for it:
// the kernel has completed (or failed) when Run returns, as a Copy has. The
// rules of Launch apply. ctx is checked before the launch; a kernel cannot
// be stopped once launched.
func (f *Function) Run(ctx context.Context, cfg LaunchConfig, args ...KernelArg) error {
	return f.mod.d.run(ctx, 1, func(s *cuda.Stream, _, _ int) error {
		return f.launch(s, cfg, args)
	})
}

// launch checks the launch and hands it to the driver.
func (f *Function) launch(s *cuda.Stream, cfg LaunchConfig, args []KernelArg) error {
	d := f.mod.d
	fail := func(err error) error { return fmt.Errorf("memory: %s: kernel %s: %w", d.dev, f.name, err) }
	if cfg.Grid.X == 0 || cfg.Block.X == 0 {
		return fail(fmt.Errorf("empty launch shape: grid %v, block %v", cfg.Grid, cfg.Block))
	}
	if len(args) > MaxKernelArgs {
		return fail(fmt.Errorf("%d arguments, at most %d", len(args), MaxKernelArgs))
	}
	if f.params != nil {
		if err := checkArgs(f.params, args); err != nil {
			return fail(err)
		}
	}
	raw := make([]cuda.KernelArg, len(args))
	for i, a := range args {
		switch {
		case a.size == 0:
			return fail(fmt.Errorf("argument %d: the zero KernelArg", i))
		case a.ptr && a.buf == nil:
			return fail(fmt.Errorf("argument %d: BufferArg(nil)", i))
		case a.ptr:
			if a.buf.Device() != d.dev {
				return fail(fmt.Errorf("argument %d: a buffer on %s", i, a.buf.Device()))
			}
			p, err := devicePtr(a.buf)
			if err != nil {
				return fail(fmt.Errorf("argument %d: %w", i, err))
			}
			raw[i] = cuda.ArgPtr(p)
		default:
			raw[i] = cuda.KernelArg(a.bits)
		}
	}
	f.mod.mu.RLock()
	defer f.mod.mu.RUnlock()
	if f.mod.m == nil {
		return ErrClosed
	}
	err := d.ctx.LaunchKernel(f.f, cfg.Grid.cuda(), cfg.Block.cuda(), cfg.SharedMem, s, raw...)
	if errors.Is(err, cuda.ErrDestroyed) {
		return ErrClosed
	}
	if err != nil {
		return fail(err)
	}
	return nil
}
