package tensor_test

import (
	"fmt"

	"github.com/tensorferry/tensorferry/tensor"
)

// A tensor's bytes are described by its dtype and shape; Shape.ByteSize
// checks the size for overflow.
func ExampleFromFloat32s() {
	t, _ := tensor.FromFloat32s([]float32{1, 2, 3, 4, 5, 6}, tensor.Shape{2, 3})
	defer t.Free()
	n, _ := t.Shape().ByteSize(t.DType())
	fmt.Println(t, n, t.Float32s()[5])
	// Output: float32[2 3]@cpu 24 6
}

// A Ref made from a local tensor lends it when sent; its receiver fetches
// it when and where it wants, or forwards it.
func ExampleNewRef() {
	t, _ := tensor.FromFloat32s([]float32{1, 2}, tensor.Shape{2})
	defer t.Free()
	r := tensor.NewRef(t)
	fmt.Println(r, r.Local() == t)
	// Output: Ref(float32[2]@cpu) true
}
