package tensor

import (
	"errors"
	"math"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestShapeSizes(t *testing.T) {
	tests := []struct {
		name  string
		shape Shape
		dt    DType
		elems int64
		bytes int64
		err   error
	}{
		{"scalar", Shape{}, Float32, 1, 4, nil},
		{"nil is a scalar", nil, Float64, 1, 8, nil},
		{"vector", Shape{3}, Int16, 3, 6, nil},
		{"matrix", Shape{2, 3}, Float32, 6, 24, nil},
		{"empty", Shape{4, 0, 5}, Int64, 0, 0, nil},
		{"16 dims", make(Shape, MaxDims), Bool, 0, 0, nil},
		{"17 dims", make(Shape, MaxDims+1), Bool, 0, 0, ErrBadShape},
		{"negative", Shape{2, -1}, Float32, 0, 0, ErrBadShape},
		{"min int64", Shape{math.MinInt64}, Uint8, 0, 0, ErrBadShape},
		{"elements overflow", Shape{1 << 40, 1 << 40}, Uint8, 0, 0, ErrOverflow},
		{"elements overflow past zero", Shape{1 << 32, 1 << 32, 0}, Uint8, 0, 0, ErrOverflow},
		{"max elements", Shape{math.MaxInt64}, Uint8, math.MaxInt64, math.MaxInt64, nil},
		{"bytes overflow", Shape{math.MaxInt64/4 + 1}, Float32, math.MaxInt64/4 + 1, 0, ErrOverflow},
		{"bytes just fit", Shape{math.MaxInt64 / 8}, Float64, math.MaxInt64 / 8, math.MaxInt64 / 8 * 8, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "16 dims" {
				for i := range tc.shape {
					tc.shape[i] = 1
				}
				tc.elems, tc.bytes = 1, 1
			}
			n, err := tc.shape.ByteSize(tc.dt)
			if !errors.Is(err, tc.err) || (err == nil && n != tc.bytes) {
				t.Fatalf("ByteSize = %d, %v; want %d, %v", n, err, tc.bytes, tc.err)
			}
			e, err := tc.shape.NumElements()
			if tc.err == ErrBadShape || (tc.err == ErrOverflow && tc.elems == 0) {
				if !errors.Is(err, tc.err) {
					t.Fatalf("NumElements error %v, want %v", err, tc.err)
				}
			} else if err != nil || e != tc.elems {
				t.Fatalf("NumElements = %d, %v; want %d", e, err, tc.elems)
			}
		})
	}
}

func TestShapeHelpers(t *testing.T) {
	s := Shape{2, 3}
	c := s.Clone()
	c[0] = 9
	if s[0] != 2 || !s.Equal(Shape{2, 3}) || s.Equal(c) || s.Equal(Shape{2}) || !Shape(nil).Equal(Shape{}) {
		t.Error("Clone or Equal")
	}
	if s.String() != "[2 3]" || (Shape{}).String() != "[]" {
		t.Errorf("String: %s %s", s, Shape{})
	}
}

func TestShapeDecodeBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"fixarray", []byte{0x92, 0x02, 0x03}, true},
		{"nil", []byte{0xc0}, true},
		{"17 dims", append([]byte{0xdc, 0x00, 17}, make([]byte, 17)...), false},
		{"array32 of 2^32-1", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false},
		{"truncated", []byte{0x93, 0x01}, false},
		{"not an array", []byte{0xa1, 'x'}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Shape
			err := msgpack.Unmarshal(tc.in, &s)
			if (err == nil) != tc.ok {
				t.Fatalf("decode: %v (shape %v)", err, s)
			}
		})
	}
	b, err := msgpack.Marshal(Shape{4, 5, 6})
	if err != nil {
		t.Fatal(err)
	}
	var s Shape
	if err := msgpack.Unmarshal(b, &s); err != nil || !s.Equal(Shape{4, 5, 6}) {
		t.Fatalf("round trip: %v %v", s, err)
	}
}
