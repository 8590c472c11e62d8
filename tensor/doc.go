// Package tensor defines tensors (DType, Shape, Tensor on a memory.Buffer),
// the Descriptor a message carries instead of a tensor's bytes, the owner's
// Store of exports and leases, and Ref, a lazily fetched tensor field.
//
// Sending a tensor lends it: the owner must not write it until every lease
// is released.
//
//	t, _ := tensor.FromFloat32s([]float32{1, 2, 3}, tensor.Shape{3})
//	ctx.Send(pid, &Grad{W: t})          // lends t
//	_ = t.WaitReleased(context.Background())
//	t.Float32s()[0] = 4                 // safe to write again
package tensor
