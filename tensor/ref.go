package tensor

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tensorferry/tensorferry/memory"
)

// ErrRefSpent is returned when a Ref that was already fetched or released is
// fetched again.
var ErrRefSpent = errors.New("tensor: ref already fetched or released")

// ErrDestination is wrapped by the error of a fetch into a tensor whose
// dtype, shape or size is not the fetched tensor's.
var ErrDestination = errors.New("tensor: destination does not match the tensor")

// Fetcher is what a receiving node attaches to the Refs it delivers.
type Fetcher interface {
	// FetchDescriptor allocates a tensor on dev and fills it from the owner.
	FetchDescriptor(ctx context.Context, d *Descriptor, dev memory.Device) (*Tensor, error)
	// FetchDescriptorInto fills dst, which CheckDestination accepted for
	// d, from the owner, allocating nothing for the bytes.
	FetchDescriptorInto(ctx context.Context, d *Descriptor, dst *Tensor) error
	// ReleaseDescriptor ends the descriptor's lease on the owner.
	ReleaseDescriptor(ctx context.Context, d *Descriptor) error
}

// Ref is a lazily fetched tensor: a message field of type Ref carries only a
// descriptor. The receiving actor calls Fetch when and where it wants the
// bytes, or puts the Ref into another message to forward it without moving
// any bytes; a forwarded Ref still fetches from the original owner.
//
// The zero Ref is empty. Refs are cheap to copy; copies share state.
type Ref struct{ st *refState }

type refState struct {
	mu      sync.Mutex
	local   *Tensor     // owner side: the tensor to export when sent
	desc    *Descriptor // receiver side
	fetcher Fetcher
	spent   bool

	id          uint64 // WireID
	placeholder bool   // decoded from a message body, not filled yet (field.go)
}

// NewRef makes a Ref to a local tensor. Sending it lends t as for a tensor
// field, but the receiver fetches only when it asks.
func NewRef(t *Tensor) Ref { return Ref{st: &refState{local: t, id: newWireID()}} }

// RefFromDescriptor makes a Ref that fetches d through f.
func RefFromDescriptor(d *Descriptor, f Fetcher) Ref {
	return Ref{st: &refState{desc: d, fetcher: f, id: newWireID()}}
}

// IsZero reports whether the Ref is empty.
func (r Ref) IsZero() bool { return r.st == nil }

// Local returns the local tensor of a Ref made with NewRef, else nil.
func (r Ref) Local() *Tensor {
	if r.st == nil {
		return nil
	}
	return r.st.local
}

// Descriptor returns the descriptor of a received Ref, else nil.
func (r Ref) Descriptor() *Descriptor {
	if r.st == nil {
		return nil
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	return r.st.desc
}

// Fetch copies the referenced tensor onto dev and releases the lease. A Ref
// made with NewRef returns a copy of its tensor on dev.
func (r Ref) Fetch(ctx context.Context, dev memory.Device) (*Tensor, error) {
	if r.st == nil {
		return nil, errors.New("tensor: fetch of an empty Ref")
	}
	if r.st.local != nil {
		return r.st.local.To(ctx, dev)
	}
	r.st.mu.Lock()
	if r.st.spent {
		r.st.mu.Unlock()
		return nil, ErrRefSpent
	}
	r.st.spent = true
	d, f := r.st.desc, r.st.fetcher
	r.st.mu.Unlock()
	if f == nil || d == nil {
		return nil, fmt.Errorf("tensor: %v has no fetcher (not delivered by a node)", r)
	}
	t, err := f.FetchDescriptor(ctx, d, dev)
	rerr := f.ReleaseDescriptor(context.WithoutCancel(ctx), d)
	if err != nil {
		return nil, err
	}
	if rerr != nil {
		_ = t.Free()
		return nil, rerr
	}
	return t, nil
}

// FetchInto copies the referenced tensor into dst, which must have its
// dtype and shape (else an error wrapping ErrDestination, and the Ref is
// not spent), and releases the lease. dst may be on any device; it is
// written through Write, so it must not be lent (ErrLeased). It allocates
// nothing for the bytes: a worker that pulls the same-shaped tensor every
// step fetches into the one it has. On a failed fetch dst's contents are
// unspecified. A Ref made with NewRef copies its tensor into dst.
func (r Ref) FetchInto(ctx context.Context, dst *Tensor) error {
	if r.st == nil {
		return errors.New("tensor: fetch of an empty Ref")
	}
	if dst == nil {
		return fmt.Errorf("%w: nil destination", ErrDestination)
	}
	if l := r.st.local; l != nil {
		if err := CheckDestination(dst, l.DType(), l.Shape()); err != nil {
			return err
		}
		return dst.Write(func(buf memory.Buffer) error { return memory.Copy(ctx, buf, l.Buffer()) })
	}
	r.st.mu.Lock()
	if r.st.spent {
		r.st.mu.Unlock()
		return ErrRefSpent
	}
	d, f := r.st.desc, r.st.fetcher
	if f == nil || d == nil {
		r.st.mu.Unlock()
		return fmt.Errorf("tensor: %v has no fetcher (not delivered by a node)", r)
	}
	if err := CheckDestination(dst, d.DType, d.Shape); err != nil {
		r.st.mu.Unlock()
		return err
	}
	r.st.spent = true
	r.st.mu.Unlock()
	err := f.FetchDescriptorInto(ctx, d, dst)
	if rerr := f.ReleaseDescriptor(context.WithoutCancel(ctx), d); err == nil {
		err = rerr
	}
	return err
}

// CheckDestination reports whether dst can take a tensor of dtype dt and
// shape s: nil, or an error wrapping ErrDestination that says why not.
func CheckDestination(dst *Tensor, dt DType, s Shape) error {
	switch {
	case dst == nil:
		return fmt.Errorf("%w: nil destination", ErrDestination)
	case dst.placeholder:
		return fmt.Errorf("%w: the destination is an unfilled placeholder", ErrDestination)
	case dst.DType() != dt || !dst.Shape().Equal(s):
		return fmt.Errorf("%w: %v%v into %v", ErrDestination, dt, s, dst)
	}
	n, err := s.ByteSize(dt)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDestination, err)
	}
	if dst.ByteSize() != n {
		return fmt.Errorf("%w: %d bytes into %v of %d bytes", ErrDestination, n, dst, dst.ByteSize())
	}
	return nil
}

// Forward returns the descriptor of a received Ref, to send it on to
// another node (which then fetches from the owner): ErrRefSpent once it was
// fetched or released.
func (r Ref) Forward() (*Descriptor, error) {
	if r.st == nil || r.st.local != nil {
		return nil, errors.New("tensor: only a received Ref is forwarded")
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if r.st.spent {
		return nil, fmt.Errorf("%w: cannot forward", ErrRefSpent)
	}
	if r.st.desc == nil {
		return nil, errors.New("tensor: an unfilled Ref cannot be forwarded")
	}
	return r.st.desc, nil
}

// Release gives the lease back without fetching.
func (r Ref) Release(ctx context.Context) error {
	if r.st == nil || r.st.local != nil {
		return nil
	}
	r.st.mu.Lock()
	if r.st.spent {
		r.st.mu.Unlock()
		return ErrRefSpent
	}
	r.st.spent = true
	d, f := r.st.desc, r.st.fetcher
	r.st.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.ReleaseDescriptor(ctx, d)
}

// String describes the Ref.
func (r Ref) String() string {
	switch {
	case r.st == nil:
		return "Ref(empty)"
	case r.st.desc == nil && r.st.local == nil:
		return "Ref(unfilled placeholder)"
	case r.st.local != nil:
		return "Ref(" + r.st.local.String() + ")"
	default:
		return "Ref(" + r.st.desc.String() + ")"
	}
}
