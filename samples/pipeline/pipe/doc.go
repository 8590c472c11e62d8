// Package pipe is the library behind the pipeline sample: three stage
// actors that pass activation tensors, one of them as a forwarded
// tensor.Ref, and a driver that checks every output against Reference.
//
//	res, err := pipe.Run(ctx, []*actor.Node{n0, n1, n2}, pipe.DefaultConfig(),
//		func(r pipe.BatchResult) { fmt.Println(r.Batch, r.Latency, r.OK) })
//	if err == nil && res.Failed > 0 { /* outputs differ */ }
package pipe
