// Package tensor defines tensors, how they appear in messages, and how an
// owner lends them:
//
//   - Tensor (tensor.go): a DType (dtype.go: Float32, BFloat16, Int64, ...,
//     ParseDType) and a Shape (shape.go: at most MaxDims dimensions, byte
//     sizes checked for overflow) over a memory.Buffer on any device; New,
//     FromFloat32s, FromBuffer, To (a copy on another device), Write.
//   - The message field codec (field.go): the msgpack encoding of *Tensor and
//     Ref fields as references into the message's tensor table, and the
//     placeholders decoding yields (Placeholder, Fill, RefPlaceholder,
//     FillRef).
//   - Descriptor (descriptor.go): what a message carries instead of a lent
//     tensor's bytes: owner, incarnation, export id and lease, dtype, shape,
//     device and the owner's offers to each data channel. Its msgpack
//     decoder applies Validate's limits while it reads (no count from the
//     input sizes an allocation beyond them); Shape's decoder likewise.
//   - Store (store.go): the owner's table of exports and leases (Export,
//     Acquire, Release, ReleaseHolder, ttls, incarnations), and the lend
//     check (lendcheck.go: SetLendCheck, LendViolation).
//   - Ref (ref.go): a lazily fetched tensor field, fetched when and where its
//     receiver asks, or forwarded without moving bytes.
//
// # In messages
//
// In a message body a *Tensor or Ref field is encoded only as a reference,
// the msgpack array [kind, WireID] (kind 1: a tensor, filled before
// delivery; 3: a Ref), to an entry of the message's tensor table, which
// the transfer engine (package transfer) builds beside the body: inline
// bytes, or the Descriptor of an export. The body never holds tensor bytes
// nor descriptors. Decoding a body yields placeholders that the engine
// fills (Fill, FillRef) from the table; a placeholder never filled has no
// buffer, so outside a node a message with tensor fields cannot be decoded
// into usable tensors.
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
