package tensor

import (
	"context"
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
)

func TestNewAndFromBuffer(t *testing.T) {
	x, err := New(memory.CPU, Float32, Shape{2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if x.ByteSize() != 24 || x.Device() != memory.CPU || x.DType() != Float32 || !x.Shape().Equal(Shape{2, 3}) ||
		len(x.Float32s()) != 6 || len(x.Host()) != 24 || x.String() != "float32[2 3]@cpu" {
		t.Fatalf("tensor %v: %d bytes", x, x.ByteSize())
	}
	for _, b := range x.Host() {
		if b != 0 {
			t.Fatal("host tensor not zeroed")
		}
	}
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
	if err := x.Free(); !errors.Is(err, memory.ErrFreed) {
		t.Fatalf("second Free: %v", err)
	}
	for _, tc := range []struct {
		name  string
		dt    DType
		shape Shape
		want  error
	}{
		{"bad dtype", Invalid, Shape{1}, ErrBadDType},
		{"bad shape", Float32, Shape{-1}, ErrBadShape},
		{"overflow", Float32, Shape{1 << 40, 1 << 40}, ErrOverflow},
	} {
		if _, err := New(memory.CPU, tc.dt, tc.shape); !errors.Is(err, tc.want) {
			t.Errorf("New %s: %v", tc.name, err)
		}
	}
	if _, err := New(memory.CUDA(99), Float32, Shape{1}); err == nil {
		t.Error("New on a missing GPU succeeded")
	}
	buf, _ := memory.NewHostBuffer(10)
	if _, err := FromBuffer(buf, Float32, Shape{3}); !errors.Is(err, ErrBadSize) {
		t.Errorf("FromBuffer with the wrong size: %v", err)
	}
	if _, err := FromFloat32s([]float32{1, 2}, Shape{3}); !errors.Is(err, ErrBadSize) {
		t.Errorf("FromFloat32s with the wrong count: %v", err)
	}
	y, err := FromFloat32s([]float32{1, 2, 3}, Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	z, err := y.To(context.Background(), memory.CPU)
	if err != nil {
		t.Fatal(err)
	}
	z.Float32s()[0] = 9
	if y.Float32s()[0] != 1 || z.Float32s()[2] != 3 {
		t.Fatal("To did not copy")
	}
	i, _ := New(memory.CPU, Int32, Shape{2})
	if i.Float32s() != nil {
		t.Error("Float32s of an int32 tensor")
	}
}
