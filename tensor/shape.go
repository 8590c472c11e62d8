package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// MaxDims is the largest number of dimensions a shape may have.
const MaxDims = 16

// Errors returned when validating shapes and descriptors.
var (
	ErrBadShape = errors.New("tensor: bad shape")
	ErrBadDType = errors.New("tensor: unknown dtype")
	ErrOverflow = errors.New("tensor: size overflows")
	ErrBadSize  = errors.New("tensor: byte size does not match shape × dtype size")
)

// Shape is the list of dimensions of a contiguous, row-major tensor. A
// zero-dimensional shape is a scalar of one element.
type Shape []int64

// NumElements returns the number of elements, or an error for a negative
// dimension, too many dimensions, or a product that overflows int64.
func (s Shape) NumElements() (int64, error) {
	if len(s) > MaxDims {
		return 0, fmt.Errorf("%w: %d dimensions > %d", ErrBadShape, len(s), MaxDims)
	}
	n := uint64(1)
	for i, d := range s {
		if d < 0 {
			return 0, fmt.Errorf("%w: dimension %d is %d", ErrBadShape, i, d)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: shape %v", ErrOverflow, s)
		}
		n = lo
	}
	return int64(n), nil
}

// ByteSize returns the size in bytes of a tensor of this shape and dtype.
func (s Shape) ByteSize(dt DType) (int64, error) {
	if !dt.Valid() {
		return 0, fmt.Errorf("%w: %v", ErrBadDType, dt)
	}
	n, err := s.NumElements()
	if err != nil {
		return 0, err
	}
	hi, lo := bits.Mul64(uint64(n), uint64(dt.Size()))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("%w: shape %v of %v", ErrOverflow, s, dt)
	}
	return int64(lo), nil
}

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy of the shape.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// String formats the shape as "[2 3 4]".
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

var _ msgpack.CustomDecoder = (*Shape)(nil)

// DecodeMsgpack implements msgpack.CustomDecoder: a shape of more than
// MaxDims dimensions is rejected before anything is allocated for it.
func (s *Shape) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 {
		*s = nil
		return nil
	}
	if n > MaxDims {
		return fmt.Errorf("%w: %d dimensions > %d", ErrBadShape, n, MaxDims)
	}
	out := make(Shape, n)
	for i := range out {
		if out[i], err = dec.DecodeInt64(); err != nil {
			return err
		}
	}
	*s = out
	return nil
}

var (
	_ msgp.Marshaler   = Shape(nil)
	_ msgp.Unmarshaler = (*Shape)(nil)
	_ msgp.Sizer       = Shape(nil)
)

// MarshalMsg implements msgp.Marshaler: it appends s as msgpack's
// reflection encodes it (nil for a nil shape, else an array of compact
// integers).
func (s Shape) MarshalMsg(b []byte) ([]byte, error) {
	if s == nil {
		return msgp.AppendNil(b), nil
	}
	b = msgp.AppendArrayHeader(b, uint32(len(s)))
	for _, d := range s {
		b = appendInt(b, d)
	}
	return b, nil
}

// Msgsize implements msgp.Sizer: the most bytes MarshalMsg appends.
func (s Shape) Msgsize() int { return msgp.ArrayHeaderSize + len(s)*msgp.Int64Size }

// UnmarshalMsg implements msgp.Unmarshaler: it decodes the shape at the
// start of b, as DecodeMsgpack does, and returns the bytes that follow.
func (s *Shape) UnmarshalMsg(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		*s = nil
		return b[1:], nil
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, err
	}
	if n > MaxDims {
		return nil, fmt.Errorf("%w: %d dimensions > %d", ErrBadShape, n, MaxDims)
	}
	out := make(Shape, n)
	for i := range out {
		if out[i], b, err = msgp.ReadInt64Bytes(b); err != nil {
			return nil, err
		}
	}
	*s = out
	return b, nil
}
