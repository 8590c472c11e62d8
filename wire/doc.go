// Package wire is tensorferry's control plane: the frame codec, the
// authenticating handshake, connections that batch small frames, and the
// registry that serializes user messages. It uses no gRPC.
//
// A frame is a 12-byte header (length, type, flags, reserved, stream id, big
// endian) and a msgpack payload. Tensors do not ride here: their bytes go
// over an rdma channel (frame types 11 to 13 are reserved and read as
// *UnknownFrame). Framer reads and writes frames without connection state;
// in every msgpack body, declared lengths and counts are checked against the
// bytes that are there, and nesting against MaxMsgpackDepth, before anything
// is allocated from them, and a frame's length is checked against the
// maximum before anything is allocated.
//
// A connection starts with Handshake (version, cluster, mutual HMAC-SHA256
// challenge–response over the cluster secret); only then is it wrapped in a
// Conn, which runs one reader and one writer goroutine:
//
//	cfg := wire.HandshakeConfig{Cluster: "lab", Node: "n1", Incarnation: inc,
//		Secret: secret, Purpose: wire.PurposeControl, Expect: "n2"}
//	nc, _ := net.Dial("tcp", addr)
//	remote, err := wire.Handshake(ctx, nc, cfg, true) // false on the accepting side
//	if err != nil {
//		return err // nc is closed; errors.Is(err, wire.ErrAuthFailed) etc.
//	}
//	c := wire.NewConn(nc, remote, wire.ConnOptions{
//		Handler: func(f wire.Frame) { /* in order, one at a time, on the reader */ },
//		OnClose: func(err error) { /* once */ },
//	})
//	c.Start()
//	name, ser, body, _ := registry.AppendEncode(nil, &Grad{Step: 1})
//	err = c.Send(ctx, wire.FrameMessage, 0, 0, &wire.Message{Target: "ps", Type: name, Ser: ser, Body: body})
//
// Frames are written in the order Send was called. Under load the writer
// goroutine batches everything queued into one write; with
// ConnOptions.DirectWrite an idle Conn writes on the caller's goroutine
// instead (a direct write), which saves a goroutine hand-off per message;
// a one-way burst (no frame read since the last direct write, within
// 200µs of it) still goes to the writer, to be batched. User messages sent
// with SendMessage go further: those sent while the writer is busy share
// one FrameMessages frame (up to MaxBatchMessages), so a burst costs one
// header, one queue slot and one decode pass per batch:
//
//	err = c.SendMessage(ctx, &wire.Message{Target: "ps", Type: name, Ser: ser, Body: body})
//
// A sender appends to the open batch under one mutex, which the writer
// takes once per batch to close it; a message sent after that goes to the
// next batch. A message with the same target, sender and type as the one
// before it in the batch copies their encoding. At most 8 FrameMessages
// batches wait per Conn: a slow peer holds senders back (in bytes, not
// only in frames).
//
// Between processes of one host, a Conn runs on shared memory: with
// HandshakeConfig.SharedMemory on both ends (Remote.SharedMemory), package
// shm's Upgrade moves the connection's bytes to rings in shared memory
// right after the handshake, and NewConn takes the *shm.Conn it returns.
//
// One goroutine reads at a time: the one holding the connection's read
// role. The reader goroutine does, except while a caller waiting for a
// frame from the peer (a request's reply) reads the connection itself
// through Conn.Await. That needs a connection whose reads a read deadline
// interrupts cleanly: a socket, or an InterruptibleReader (shm's rings,
// internal/memnet's connections). Once the reader goroutine has seen a
// caller miss the role, callers read their own replies (the poller wakes
// them, not the reader goroutine that would hand the reply over), and the
// reader goroutine takes reading back when no caller has read for
// ConnOptions.CallerReads (see lead.go).
//
// With ConnOptions.HandlerTakeover, a Handler call that blocks hands the
// reading to a new goroutine instead of stalling the connection, once it
// called Conn.MayBlock (its message has its place downstream): a call
// merely slow is waited for, so frames keep their order.
//
// Words that mean more than one thing in tensorferry, as this package
// uses them:
//   - direct write (ConnOptions.DirectWrite, config
//     transport.direct_write): a frame written on the sending goroutine
//     rather than by the writer goroutine. Nothing to do with rdma's
//     direct fetch (rdma.DirectFetcher: an ipc copy made on the calling
//     goroutine) or rdma.DirectSmall (a small GPU tensor sent by ipc
//     rather than inline).
//   - inline: Message.Tensors carries inline tensors (the bytes of a
//     tensor at or below transport.inline_threshold, in the frame; opaque
//     to this package). Inline delivery (package actor: an actor's handler
//     run on the goroutine that reads the connection) is, to a Conn, only
//     a Handler call that may block (MayBlock).
//   - reader: whichever goroutine holds the read role, the Conn's reader
//     goroutine or a caller in Await; Handler runs on it.
//
// All msgpack in this package is read and written with one primitive
// layer, tinylib/msgp's msgp package (Append*, Read*Bytes, Skip): the
// Message envelope (which implements msgp.Marshaler and msgp.Unmarshaler)
// and FrameMessages batches are encoded and decoded with it directly, with
// every declared length and count checked against the bytes that are there
// before anything is sized from it. Other frame bodies and reflective user
// messages go through vmihailenco/msgpack once the body has been validated
// (lengths, counts and nesting, see DecodeMsgpack).
//
// The Registry serializes user messages with msgpack (SerMsgpack) or
// protobuf (SerProtobuf, for proto.Message types). A msgpack type whose
// pointer implements msgp.Marshaler and msgp.Unmarshaler, the methods msgp's
// generator writes, is encoded and decoded by them, without reflection;
// others use vmihailenco's reflection. Both write maps keyed by field name
// (or msgpack tag name), so a body from either decodes with the other:
//
//	//go:generate msgp -io=false -tests=false
//	type Grad struct {
//		Step int
//		G    []float32 `msgpack:",allownil"` // nil stays nil, as with reflection
//	}
//
// Registry.Decode finds a message's type by name; a reader that decodes
// many messages of one type takes its registration once (Registry.Type)
// and decodes through it (RegisteredType.Decode). A decoder must not keep
// the body it is given: a batch's bodies are slices of the frame, which
// the next frame overwrites.
//
// There is no unsafe in this package.
//
// Errors come in two scopes, as in HTTP/2: a *ConnError kills the
// connection, a *StreamError fails one request or transfer. Sentinels
// (ErrFrameTooLarge, ErrShortFrame, ErrAuthFailed, ...) are wrapped and
// tested with errors.Is. ErrCode is the one table of error codes: the rdma
// channels' control replies and staging statuses carry it too, and an
// ErrorTable maps a sender's error to a code and the code back to the same
// sentinel at the receiver.
package wire
