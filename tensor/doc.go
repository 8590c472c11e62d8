// Package tensor defines tensors (DType, Shape, Tensor on a memory.Buffer),
// the Descriptor a message carries instead of a tensor's bytes, the owner's
// Store of exports and leases, and Ref, a lazily fetched tensor field.
//
// # In messages
//
// In a message body a *Tensor or Ref field is encoded only as a reference,
// [kind, WireID], to an entry of the message's tensor table, which the
// transfer engine (package transfer) builds beside the body: inline bytes,
// or the Descriptor of an export. Decoding a body yields placeholders that
// the engine fills (Fill, FillRef) from the table; outside a node a message
// with tensor fields cannot be decoded into usable tensors (field.go).
// Tensor, Ref, Shape and Descriptor encode and decode themselves both for
// vmihailenco/msgpack's reflection and for code tinylib/msgp generates
// (MarshalMsg, UnmarshalMsg, Msgsize), with the same bytes, so message types
// with generated codecs may hold them.
//
// # Lending
//
// Sending a tensor lends it: Store.Export takes a lease, and the receiver
// releases it once it has fetched the bytes (or the lease's ttl passes, or
// the receiving node goes down). The owner must not write the tensor until
// every lease is released. Released returns a channel closed when none is
// out, for an actor's select (or piped into its own mailbox, so that its
// Receive never blocks); WaitReleased blocks on it. Buffer, Host and
// Float32s are read paths; Write is the checked write path: it fails with
// ErrLeased, naming the lease count, while the tensor is lent, and while
// its callback runs the tensor cannot be lent (Export fails with
// ErrWriting).
//
//	t, _ := tensor.FromFloat32s([]float32{1, 2, 3}, tensor.Shape{3})
//	ctx.Send(pid, &Grad{W: t})          // lends t
//	<-t.Released()
//	err := t.Write(func(buf memory.Buffer) error {
//		t.Float32s()[0] = 4             // safe: t is not lent
//		return nil
//	})
//
// Writing a lent tensor through a read path is a bug Write cannot see. For
// debugging, Store.SetLendCheck checksums every exported tensor at export
// and again when its lease ends, and reports a tensor that changed in
// between (LendViolation, counted by Store.LendViolations). It costs two
// full reads of the tensor per send, so it is off by default.
package tensor
