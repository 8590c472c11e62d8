package tensor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/vmihailenco/msgpack/v5"
)

// fakeEncode exports tensors above threshold bytes to a store; Refs always.
type fakeEncode struct {
	store     *Store
	threshold int64
	exported  int
}

func (s *fakeEncode) ExportTensor(t *Tensor, asRef bool) (*Descriptor, error) {
	if !asRef && t.ByteSize() <= s.threshold {
		return nil, nil
	}
	s.exported++
	_, d, err := s.store.Export(t, "peer", 0)
	return d, err
}

// fakeDecode fetches descriptors from the owner's store directly, as a data
// channel would, and bounds what it allocates.
type fakeDecode struct {
	owner    *Store
	maxBytes int64
}

func (s *fakeDecode) InlineTensor(dt DType, shape Shape, data []byte) (*Tensor, error) {
	x, err := New(memory.CPU, dt, shape)
	if err != nil {
		return nil, err
	}
	copy(x.Host(), data)
	return x, nil
}

func (s *fakeDecode) fetch(d *Descriptor) (*Tensor, error) {
	if d.Bytes > s.maxBytes {
		return nil, fmt.Errorf("fake: %d bytes too large", d.Bytes)
	}
	x, err := New(memory.CPU, d.DType, d.Shape)
	if err != nil {
		return nil, err
	}
	if s.owner == nil {
		return x, nil
	}
	e, done, err := s.owner.Acquire(d.Incarnation, d.ExportID, d.Lease)
	if err != nil {
		return nil, err
	}
	defer done()
	copy(x.Host(), e.Tensor.Host())
	return x, nil
}

func (s *fakeDecode) FetchDescriptor(_ context.Context, d *Descriptor, dev memory.Device) (*Tensor, error) {
	return s.fetch(d)
}

func (s *fakeDecode) ReleaseDescriptor(_ context.Context, d *Descriptor) error {
	if s.owner == nil {
		return nil
	}
	return s.owner.Release(d.ExportID, d.Lease)
}

func (s *fakeDecode) ImportTensor(d *Descriptor) (*Tensor, error) {
	x, err := s.fetch(d)
	if err != nil {
		return nil, err
	}
	if s.owner != nil {
		if err := s.owner.Release(d.ExportID, d.Lease); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func (s *fakeDecode) ImportRef(d *Descriptor) (Ref, error) { return RefFromDescriptor(d, s), nil }

type message struct {
	Name  string
	Small *Tensor
	Large *Tensor
	Lazy  Ref
	None  Ref
	Many  []*Tensor
}

func float32Tensor(t *testing.T, n int, base float32) *Tensor {
	t.Helper()
	v := make([]float32, n)
	for i := range v {
		v[i] = base + float32(i)
	}
	x, err := FromFloat32s(v, Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func sameData(a, b *Tensor) bool {
	return a.DType() == b.DType() && a.Shape().Equal(b.Shape()) && bytes.Equal(a.Host(), b.Host())
}

func TestCodecRoundTrip(t *testing.T) {
	owner := NewStore("a", 1)
	defer owner.Close()
	small, large, lazy := float32Tensor(t, 4, 1), float32Tensor(t, 1000, 2), float32Tensor(t, 50, 3)
	scalar, _ := New(memory.CPU, Int64, Shape{})
	in := message{Name: "m", Small: small, Large: large, Lazy: NewRef(lazy), Many: []*Tensor{scalar, float32Tensor(t, 300, 4)}}
	enc := &fakeEncode{store: owner, threshold: 64}
	b, err := Marshal(in, enc)
	if err != nil {
		t.Fatal(err)
	}
	if enc.exported != 3 || owner.Len() != 3 || large.Leases() != 1 || lazy.Leases() != 1 || small.Leases() != 0 {
		t.Fatalf("exported %d, store %d, leases large %d lazy %d small %d", enc.exported, owner.Len(), large.Leases(), lazy.Leases(), small.Leases())
	}
	if bytes.Contains(b, large.Host()[:64]) {
		t.Error("an exported tensor's bytes went inline")
	}
	var out message
	dec := &fakeDecode{owner: owner, maxBytes: 1 << 20}
	if err := NewDecoder(b, dec).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Name != "m" || !sameData(out.Small, small) || !sameData(out.Large, large) || !sameData(out.Many[0], scalar) ||
		!sameData(out.Many[1], in.Many[1]) || !out.None.IsZero() {
		t.Fatalf("decoded %+v", out)
	}
	if large.Leases() != 0 || owner.Len() != 1 {
		t.Fatalf("after import: large leases %d, store %d", large.Leases(), owner.Len())
	}
	// The Ref is lazy: nothing moved yet; it can be forwarded as is.
	if out.Lazy.Descriptor() == nil || lazy.Leases() != 1 {
		t.Fatalf("lazy ref %v, leases %d", out.Lazy, lazy.Leases())
	}
	fwd, err := Marshal(struct{ R Ref }{out.Lazy}, &fakeEncode{store: NewStore("b", 1)})
	if err != nil {
		t.Fatal(err)
	}
	var third struct{ R Ref }
	if err := NewDecoder(fwd, dec).Decode(&third); err != nil {
		t.Fatal(err)
	}
	if third.R.Descriptor().Owner != "a" || third.R.Descriptor().ExportID != out.Lazy.Descriptor().ExportID {
		t.Fatalf("forwarded ref %v", third.R)
	}
	got, err := third.R.Fetch(context.Background(), memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	if !sameData(got, lazy) || lazy.Leases() != 0 {
		t.Fatalf("fetched %v, leases %d", got, lazy.Leases())
	}
	if _, err := third.R.Fetch(context.Background(), memory.CPU); !errors.Is(err, ErrRefSpent) {
		t.Errorf("second Fetch: %v", err)
	}
	if err := third.R.Release(context.Background()); !errors.Is(err, ErrRefSpent) {
		t.Errorf("Release after Fetch: %v", err)
	}
	if _, err := Marshal(struct{ R Ref }{third.R}, nil); !errors.Is(err, ErrRefSpent) {
		t.Errorf("forwarding a spent Ref: %v", err)
	}
}

func TestCodecWithoutSession(t *testing.T) {
	x := float32Tensor(t, 3, 1)
	// Plain msgpack: tensors go inline and come back as host tensors.
	b, err := msgpack.Marshal(struct{ T *Tensor }{x})
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ T *Tensor }
	if err := msgpack.Unmarshal(b, &out); err != nil || !sameData(out.T, x) {
		t.Fatalf("inline without a session: %v %v", out.T, err)
	}
	// A local Ref cannot be sent without a node.
	if _, err := msgpack.Marshal(struct{ R Ref }{NewRef(x)}); !errors.Is(err, ErrNoSession) {
		t.Errorf("local Ref without a session: %v", err)
	}
	// A descriptor met without a session.
	owner := NewStore("a", 1)
	defer owner.Close()
	b, err = Marshal(struct{ T *Tensor }{x}, &fakeEncode{store: owner})
	if err != nil {
		t.Fatal(err)
	}
	if err := msgpack.Unmarshal(b, &out); !errors.Is(err, ErrNoSession) {
		t.Errorf("descriptor without a session: %v", err)
	}
	// A Ref decoded without a session keeps its descriptor but cannot fetch.
	b, err = Marshal(struct{ R Ref }{NewRef(x)}, &fakeEncode{store: owner})
	if err != nil {
		t.Fatal(err)
	}
	var r struct{ R Ref }
	if err := msgpack.Unmarshal(b, &r); err != nil || r.R.Descriptor() == nil {
		t.Fatalf("ref without a session: %v %v", r.R, err)
	}
	if _, err := r.R.Fetch(context.Background(), memory.CPU); err == nil {
		t.Error("Fetch of a Ref with no fetcher succeeded")
	}
	// A local Ref fetches a copy of its tensor.
	c, err := NewRef(x).Fetch(context.Background(), memory.CPU)
	if err != nil || !sameData(c, x) {
		t.Fatalf("local Ref fetch: %v", err)
	}
	if _, err := (Ref{}).Fetch(context.Background(), memory.CPU); err == nil {
		t.Error("Fetch of an empty Ref succeeded")
	}
}

func TestCodecRejects(t *testing.T) {
	enc := func(v ...any) []byte {
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		for _, x := range v {
			if err := e.Encode(x); err != nil {
				t.Fatal(err)
			}
		}
		return buf.Bytes()
	}
	arr := func(n int, rest ...any) []byte {
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		_ = e.EncodeArrayLen(n)
		for _, x := range rest {
			_ = e.Encode(x)
		}
		return buf.Bytes()
	}
	bad := validDescriptor()
	bad.Bytes++
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"inline size mismatch", arr(4, wireInline, Float32, []int64{2}, []byte{1, 2, 3}), ErrBadSize},
		{"inline bad dtype", arr(4, wireInline, 0, []int64{1}, []byte{1}), ErrBadDType},
		{"inline negative dim", arr(4, wireInline, Uint8, []int64{-1}, []byte{}), ErrBadShape},
		{"inline overflow", arr(4, wireInline, Uint8, []int64{1 << 40, 1 << 40}, []byte{}), ErrOverflow},
		{"inline too many dims", arr(4, wireInline, Uint8, make([]int64, 17), []byte{}), ErrBadShape},
		{"bad descriptor", arr(2, wireDescriptor, bad), ErrBadDescriptor},
		{"unknown kind", arr(2, 9, 1), nil},
		{"ref kind for a tensor", arr(2, wireRef, validDescriptor()), nil},
		{"not an array", enc("x"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var x Tensor
			err := NewDecoder(tc.in, &fakeDecode{maxBytes: 1 << 20}).Decode(&x)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("decode: %v, want %v", err, tc.want)
			}
		})
	}
	var r Ref
	if err := NewDecoder(arr(2, wireDescriptor, validDescriptor()), &fakeDecode{}).Decode(&r); err == nil {
		t.Error("a tensor descriptor decoded as a Ref")
	}
}

// FuzzDecodeTensor decodes arbitrary bytes as a message with tensors and
// refs through a session that allocates host tensors: it must never panic
// (the session bounds what it allocates; the decoder must bound the rest).
func FuzzDecodeTensor(f *testing.F) {
	owner := NewStore("a", 1)
	defer owner.Close()
	seed := func(v any, s EncodeSession) {
		b, err := Marshal(v, s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	x, _ := FromFloat32s([]float32{1, 2, 3, 4}, Shape{2, 2})
	seed(message{Small: x}, nil)
	seed(message{Small: x, Large: x, Lazy: NewRef(x)}, &fakeEncode{store: owner})
	seed(struct{ T *Tensor }{x}, &fakeEncode{store: owner, threshold: 1 << 20})
	f.Add([]byte{0x81, 0xa1, 'T', 0x92, 0x02, 0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 64<<10 {
			return
		}
		var m message
		_ = NewDecoder(in, &fakeDecode{maxBytes: 1 << 20}).Decode(&m)
		var d Descriptor
		if msgpack.Unmarshal(in, &d) == nil {
			_ = d.Validate()
			_ = d.String()
		}
	})
}
