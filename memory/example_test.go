package memory_test

import (
	"context"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
)

// Buffers on any device are copied with Copy: here host to host; with a
// GPU, the same call copies to, from or between devices.
func ExampleCopy() {
	dev, _ := memory.ParseDevice("cpu")
	a, _ := memory.AllocatorFor(dev)
	src, _ := a.Alloc(4)
	dst, _ := a.Alloc(4)
	defer src.Free()
	defer dst.Free()
	copy(src.Host(), []byte{1, 2, 3, 4})
	if err := memory.Copy(context.Background(), dst, src); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dst.Host(), dst.Device())
	// Output: [1 2 3 4] cpu
}
