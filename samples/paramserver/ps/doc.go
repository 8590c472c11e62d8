// Package ps is the library behind the paramserver sample: PS shard and
// worker actors that train linear regression on tensorferry nodes.
//
// Every node of the training cluster runs an Agent; the driver node (the
// node of worker 0 in the Layout) then calls Drive, which sets every node
// up, trains and returns the Result:
//
//	cc, _ := config.LocalConfig("ps", 3)
//	// for each node: n, _ := actor.NewNode(cc, name); ps.Serve(n, cc); n.Start()
//	layout, _ := ps.Roles([]string{"node0", "node1", "node2"}, 2, 2)
//	res, err := ps.Drive(ctx, driverNode, ps.DefaultConfig(), layout, nil)
//	fmt.Println(res.Distance, res.Channels["staging"].Bytes)
//
// The shards' float32 vector math (axpy, sgd; kernels.go) and the workers'
// gradient (residual, scatter; gradient.go) run as the CUDA kernels of
// kernels.ptx on GPUs, loaded and launched through memory.LoadModule, and
// as Go loops on host memory; kernels.cu is their CUDA C.
package ps
