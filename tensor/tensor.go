package tensor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tensorferry/tensorferry/memory"
)

// ErrLeased is returned by Write and Free while leases on the tensor are
// outstanding. The error wrapping it names the tensor and the lease count.
var ErrLeased = errors.New("tensor: tensor is lent out (leases outstanding)")

// ErrWriting is returned by Store.Export for a tensor whose Write is in
// progress.
var ErrWriting = errors.New("tensor: tensor is being written")

// Tensor is a contiguous, row-major tensor on one device. The tensor owns its
// buffer unless made with View semantics by the caller.
//
// Sending a tensor to a remote actor lends it: the runtime takes a lease, and
// the owner must not write the tensor until every lease is released. Leases
// reports how many are out; Released and WaitReleased say when none are.
// Write is the checked write path: it fails with ErrLeased while the tensor
// is lent. Buffer, Host and Float32s are the read paths.
type Tensor struct {
	dtype DType
	shape Shape
	buf   memory.Buffer

	mu      sync.Mutex
	leases  int
	writers int           // Write calls in progress; no lease is taken while > 0
	idle    chan struct{} // closed while leases == 0; replaced when a lease is taken
	content uint64        // names the bytes lent since leases last went from 0 to 1 (Descriptor.Content)

	id          uint64 // WireID
	placeholder bool   // decoded from a message body, not filled yet (field.go)
}

// New allocates a tensor on dev. Host memory is zeroed; device memory is not.
func New(dev memory.Device, dt DType, shape Shape) (*Tensor, error) {
	n, err := shape.ByteSize(dt)
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt {
		return nil, fmt.Errorf("%w: %d bytes", ErrOverflow, n)
	}
	a, err := memory.AllocatorFor(dev)
	if err != nil {
		return nil, err
	}
	buf, err := a.Alloc(int(n))
	if err != nil {
		return nil, err
	}
	return FromBuffer(buf, dt, shape)
}

// NewUninit allocates a tensor on dev whose contents are unspecified (it
// may reuse host memory freed earlier): for destinations that are
// overwritten whole, such as received tensors.
func NewUninit(dev memory.Device, dt DType, shape Shape) (*Tensor, error) {
	n, err := shape.ByteSize(dt)
	if err != nil {
		return nil, err
	}
	if n > math.MaxInt {
		return nil, fmt.Errorf("%w: %d bytes", ErrOverflow, n)
	}
	buf, err := memory.AllocUninit(dev, int(n))
	if err != nil {
		return nil, err
	}
	return FromBuffer(buf, dt, shape)
}

// closedIdle is the idle channel of every tensor that was never lent: a
// lease replaces it with a fresh channel, which the last release closes.
var closedIdle = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// FromBuffer makes a tensor over buf, which must hold exactly shape × dtype
// bytes. The tensor takes ownership: Free frees buf.
func FromBuffer(buf memory.Buffer, dt DType, shape Shape) (*Tensor, error) {
	n, err := shape.ByteSize(dt)
	if err != nil {
		return nil, err
	}
	if int64(buf.Len()) != n {
		return nil, fmt.Errorf("%w: buffer has %d bytes, %v of %v needs %d", ErrBadSize, buf.Len(), shape, dt, n)
	}
	t := &Tensor{dtype: dt, shape: shape.Clone(), buf: buf, idle: closedIdle, id: newWireID()}
	return t, nil
}

// FromFloat32s makes a host tensor holding a copy of data.
func FromFloat32s(data []float32, shape Shape) (*Tensor, error) {
	t, err := New(memory.CPU, Float32, shape)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != int64(t.buf.Len()/4) {
		_ = t.Free()
		return nil, fmt.Errorf("%w: %d values for shape %v", ErrBadSize, len(data), shape)
	}
	copy(t.Float32s(), data)
	return t, nil
}

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape returns the dimensions. The caller must not modify it.
func (t *Tensor) Shape() Shape { return t.shape }

// Device returns where the bytes live.
func (t *Tensor) Device() memory.Device { return t.buf.Device() }

// Buffer returns the underlying buffer. It is a read path: while the tensor
// is lent it must not be written (write through Write, which checks).
// Filling a tensor nobody else holds yet, such as a received one, is fine.
func (t *Tensor) Buffer() memory.Buffer { return t.buf }

// ByteSize returns the size in bytes.
func (t *Tensor) ByteSize() int64 { return int64(t.buf.Len()) }

// Host returns the bytes of a host tensor, nil for device tensors. Like
// Buffer it is a read path: read-only while lent; write through Write.
func (t *Tensor) Host() []byte { return t.buf.Host() }

// Float32s returns the elements of a host float32 tensor as a slice sharing
// its memory, nil for other dtypes or device tensors. Like Buffer it is a
// read path: read-only while lent; write through Write.
func (t *Tensor) Float32s() []float32 {
	b := t.buf.Host()
	if t.dtype != Float32 || len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// To returns a copy of the tensor on dev (a new tensor, even when dev is the
// tensor's own device).
func (t *Tensor) To(ctx context.Context, dev memory.Device) (*Tensor, error) {
	out, err := New(dev, t.dtype, t.shape)
	if err != nil {
		return nil, err
	}
	if err := memory.Copy(ctx, out.buf, t.buf); err != nil {
		_ = out.Free()
		return nil, err
	}
	return out, nil
}

// Leases returns the number of outstanding leases.
func (t *Tensor) Leases() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leases
}

// Released returns a channel that is closed when no lease on the tensor is
// outstanding: already closed if none is out now, else closed when the last
// one is released. A lease taken after that gives later calls a new
// channel. An actor that must write a lent tensor waits for it in a select,
// or pipes it into its own mailbox, instead of blocking its Receive in
// WaitReleased:
//
//	go func() { <-t.Released(); ctx.Send(ctx.Self(), released{t}) }()
func (t *Tensor) Released() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.idle
}

// WaitReleased blocks until no lease on the tensor is outstanding, so the
// owner may write it again, or until ctx is done. It is Released for code
// that may block.
func (t *Tensor) WaitReleased(ctx context.Context) error {
	select {
	case <-t.Released():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tensor: waiting for leases: %w", ctx.Err())
	}
}

// Write calls f with the tensor's buffer for writing, unless the tensor is
// lent: then it fails, without calling f, with an error wrapping ErrLeased
// that says how many leases are out. While f runs the tensor cannot be lent:
// Store.Export fails with ErrWriting (so f must not send the tensor). f
// must not keep buf for writing after it returns. Write returns f's error.
// Concurrent Write calls on one tensor are the caller's business, as for
// any memory.
//
//	err := t.Write(func(buf memory.Buffer) error {
//		copy(buf.Host(), update)
//		return nil
//	})
//	if errors.Is(err, tensor.ErrLeased) { /* wait for t.Released() */ }
func (t *Tensor) Write(f func(buf memory.Buffer) error) error {
	t.mu.Lock()
	if t.leases > 0 {
		n := t.leases
		t.mu.Unlock()
		return &leasedError{op: "write to", t: t, n: n}
	}
	t.writers++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.writers--
		t.mu.Unlock()
	}()
	return f(t.buf)
}

// leasedError is the ErrLeased a tensor operation fails with.
type leasedError struct {
	op string // "write to", "free"
	t  *Tensor
	n  int // leases outstanding
}

func (e *leasedError) Error() string {
	s := "s"
	if e.n == 1 {
		s = ""
	}
	return fmt.Sprintf("tensor: %s %v while lent (%d lease%s outstanding): wait for Released()", e.op, e.t, e.n, s)
}

func (e *leasedError) Unwrap() error { return ErrLeased }

// addLease takes a lease unless a Write is in progress.
func (t *Tensor) addLease() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.writers > 0 {
		return fmt.Errorf("%w: cannot lend %v until its Write returns", ErrWriting, t)
	}
	if t.leases == 0 {
		t.idle = make(chan struct{})
		t.content = nextContent.Add(1)
	}
	t.leases++
	return nil
}

// nextContent numbers the contents lent in this process (Descriptor.Content).
var nextContent atomic.Uint64

// lentContent returns the id of the content lent now; t must be lent.
func (t *Tensor) lentContent() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.content
}

func (t *Tensor) dropLease() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.leases == 0 {
		return
	}
	t.leases--
	if t.leases == 0 {
		close(t.idle)
	}
}

// Free releases the tensor's memory. It fails with an error wrapping
// ErrLeased while leases are outstanding.
func (t *Tensor) Free() error {
	if n := t.Leases(); n > 0 {
		return &leasedError{op: "free", t: t, n: n}
	}
	return t.buf.Free()
}

// String describes the tensor, e.g. "float32[2 3]@cpu".
func (t *Tensor) String() string {
	return fmt.Sprintf("%v%v@%v", t.dtype, t.shape, t.buf.Device())
}
