package tensor_test

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// Write fails while the tensor is lent; the owner waits for Released (in a
// select, or piped into its mailbox) and writes then.
func ExampleTensor_Write() {
	s := tensor.NewStore("owner", 1)
	defer s.Close()
	t, _ := tensor.FromFloat32s([]float32{1, 2, 3, 4}, tensor.Shape{4})
	e, _, _ := s.Export(t, "peer", 0) // what sending t does

	double := func(buf memory.Buffer) error {
		for i, v := range t.Float32s() {
			t.Float32s()[i] = 2 * v
		}
		return nil
	}
	err := t.Write(double)
	fmt.Println(errors.Is(err, tensor.ErrLeased))
	fmt.Println(err)

	_ = s.Release(e.ID, e.Lease) // what the peer does once it has fetched t
	<-t.Released()
	fmt.Println(t.Write(double), t.Float32s())
	// Output:
	// true
	// tensor: write to float32[4]@cpu while lent (1 lease outstanding): wait for Released()
	// <nil> [2 4 6 8]
}

// The lend check reports an owner that writes a lent tensor through a read
// path.
func ExampleStore_SetLendCheck() {
	s := tensor.NewStore("owner", 1)
	defer s.Close()
	s.SetLendCheck(func(v tensor.LendViolation) {
		fmt.Printf("export %d of %v to %s written while lent\n", v.ExportID, v.Tensor, v.Holder)
	})
	t, _ := tensor.FromFloat32s([]float32{1, 2, 3, 4}, tensor.Shape{4})
	e, _, _ := s.Export(t, "peer", 0)
	t.Float32s()[0] = 5 // a bug: t is lent
	_ = s.Release(e.ID, e.Lease)
	fmt.Println(s.LendViolations())
	// Output:
	// export 1 of float32[4]@cpu to peer written while lent
	// 1
}
