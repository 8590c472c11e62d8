// Package actor runs protoactor-go actors as nodes of a tensorferry cluster:
// it is the protoactor integration only (remote process and resolver,
// Request, the inline mailbox, watches, props options); the tensor path is
// package transfer.
//
// A Node attaches to a protoactor-go ActorSystem (NewRemote, like
// protoactor's remote.NewRemote; NewNode makes the system too) and
// registers an address resolver, so PIDs of actors on other nodes (a
// PID's Address is the node's name from the cluster config) work with
// protoactor's own API: Send,
// Request and Respond, RequestFuture, Watch and Unwatch with Terminated,
// Stop and Poison. Messages travel over tensorferry's own wire protocol; no
// gRPC is involved.
//
// Message types that cross nodes are registered by name. Fields of type
// *tensor.Tensor are copied inline when small and otherwise fetched out of
// band, through the fastest data channel both ends share, before the message
// is delivered; fields of type tensor.Ref are delivered lazily.
//
//	cfg, _ := config.Load("cluster.yaml")
//	system := pa.NewActorSystem()                  // pa: protoactor-go/actor
//	node, _ := actor.NewRemote(system, cfg, "a")   // or actor.NewNode(cfg, "a")
//	_ = node.Start()
//	defer node.Stop()
//	actor.MustRegisterMessage("demo.Ping", &Ping{})
//	pid := node.PID("b", "echo")
//	res, err := node.Root().RequestFuture(pid, &Ping{}, time.Second).Result()
//
// For request/response traffic, Node.Request waits for a reply without
// protoactor's future, reading it from the connection itself when nobody
// else does (no hand-off from the connection's reader), and
// Node.WithInlineDelivery lets a serving actor run requests on the
// goroutine that reads the connection:
//
//	props := pa.PropsFromFunc(serve, node.WithInlineDelivery()) // on "b" (pa: protoactor-go/actor)
//	res, err = node.Request(ctx, pid, &Ping{})                     // on "a"
//	res, err = node.RequestTimeout(pid, &Ping{}, time.Second)      // bounded per request, no timer armed
//
// Two words mean several things in tensorferry; each name here says which:
//   - inline tensor: a tensor small enough (transport.inline_threshold) to
//     be copied into the message's frame instead of fetched out of band
//     (package transfer).
//   - inline delivery (WithInlineDelivery, transport.inline_delivery,
//     Stats' MessagesInline): a message's handler run on the goroutine that
//     delivers it, the connection's reader (or the engine's goroutine that
//     fetched its tensors), instead of a goroutine started for it, through
//     the actor's inline mailbox. The Python node's inline handlers
//     (Node.handle(..., inline=True)) are the same idea on its side.
//   - delivered at once: a received message with nothing to fetch, and
//     nothing of its peer waiting ahead of it, is posted to its actor by
//     the reader rather than through the engine's inbox; whether its
//     handler then runs on the reader is inline delivery's business.
//   - direct write (transport.direct_write): a frame written by the
//     sending goroutine instead of the connection's writer goroutine
//     (package wire).
//   - direct fetch (rdma.DirectFetcher, the ipc channel's direct offers):
//     a tensor copied on the calling goroutine with nothing to wait for
//     from another node. rdma.DirectSmall names the channel (ipc) that
//     moves a small GPU tensor device to device rather than inline.
//
// With WithTracerProvider a node traces its messages with OpenTelemetry:
// the send, the export of its tensors, and on the receiving node the
// receipt, each fetch and the delivery are spans of one trace, whose
// context travels in the message header (see package tracing).
//
//	tp, shutdown, _ := tracing.FromEnv(ctx) // the OTEL_* variables
//	defer shutdown(ctx)
//	node, _ = actor.NewNode(cfg, "a", actor.WithTracerProvider(tp))
package actor
