package local_test

import (
	"context"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/local"
	"github.com/tensorferry/tensorferry/tensor"
)

func Example() {
	store := tensor.NewStore("node", 1)
	defer store.Close()
	ch, err := local.New(&rdma.Env{Node: "node", Incarnation: 1, Store: store})
	if err != nil {
		panic(err)
	}
	defer ch.Close()

	x, _ := tensor.FromFloat32s([]float32{1, 2, 3}, tensor.Shape{3})
	_, d, _ := store.Export(x, "node", 0) // what a message would carry

	dst, _ := memory.NewHostBuffer(int(d.Bytes))
	if err := ch.Fetch(context.Background(), d, dst); err != nil {
		panic(err)
	}
	_ = store.Release(d.ExportID, d.Lease)
	fmt.Println(dst.Host()[4:8], x.Leases())
	// Output: [0 0 0 64] 0
}
