// Package transfer is tensorferry's tensor path: how a tensor in an actor
// message becomes an out-of-band transfer and a tensor again. It imports
// nothing of the actor system; a node drives it through Engine's methods
// and it reaches the node's peers through Link (a control connection) and
// Config.Dial (data connections).
//
// The path of a tensor, file by file:
//
//  1. plan.go: the tensor fields of a message type (*tensor.Tensor,
//     tensor.Ref, nested) are found once per type; a walk visits only them.
//  2. export.go: Export walks an outgoing message once: small tensors are
//     copied into the table (inline tensors, up to
//     Config.InlineThreshold, but for a small GPU tensor that
//     rdma.DirectSmall moves device to device), larger ones exported to the
//     node's tensor.Store (lent) with each channel's offer; the result is
//     the tensor table. "Inline" here is about tensors only; InlineDelivery
//     (inbox.go) is about which goroutine runs a received message's handler.
//  3. table.go: the table travels beside the body (wire.Message.Tensors);
//     in the body each field is only a reference [kind, id] (tensor/field.go).
//  4. export.go: Send sends when the peer's credits allow (credits.go), in
//     order, never blocking: the rest waits in the peer's outbox.
//  5. import.go: Import fills the fields of a decoded message from its
//     table: inline tensors and Refs at once; descriptors to fetch are kept.
//  6. inbox.go: which route a received message takes, decided there and
//     nowhere else (the node asks PeerFlow.Queues, then hands it to Accept):
//     - at once: nothing to fetch and nothing of its peer queued ahead:
//     the node delivers it at once, on the connection's reader, and the
//     engine never sees it (order holds: nothing waits before it);
//     - on the reader (Receive): alone in its frame, with one tensor of
//     at most ReaderFetchMax whose channel fetches it without waiting
//     for another node (rdma.DirectFetcher: ipc from a mapped
//     allocation) and whose budgets have room at once: fetched and
//     delivered on the reader itself, without a hand-off (the
//     cheapest route for a tensor); an InlineDelivery's handler may keep
//     the reader (the connection's take-over then moves the reading on);
//     - lone in the loop: anything else that finds the peer's inbox empty
//     is fetched and delivered on the peer's delivery loop goroutine,
//     where an InlineDelivery may run its handler once the loop has moved
//     to a new goroutine;
//     - queued (Enqueue): behind others, within the inbox's bounds and the
//     window advertised to the peer; deliverLoop takes the per-peer and
//     per-node budgets (credits.go), allocates the destinations, fetches
//     up to fetchWindow at once, each on a goroutine of its own
//     (channels.go: rdma.Select picks the channel), releases the leases
//     and delivers in arrival order. A message whose fetch may lead or
//     join a relay (below) always goes this way, even alone, so that the
//     peer's next messages, which may lend the same content, are read
//     meanwhile.
//
// relay.go and relayplan.go: fan-out by relay. A descriptor names its
// content (tensor.Descriptor.Content: the same for every export of a
// tensor while it stays lent, since the owner cannot write it then). A
// fetch of Config.Flow.RelayMinBytes or more (default 64 MiB) whose content
// this node is already fetching for another message or Ref does not cross
// the link again: it waits for that first fetch (the leader) and copies
// its destination on the node (memory.Copy: device to device on a GPU),
// because a device-local copy costs a fraction of a second transfer from
// the owner, whose egress N receivers would otherwise share. The leader
// is not delivered (its actor cannot write its copy) until its followers
// have copied; a follower whose leader failed fetches from the owner; each
// keeps and releases its own lease, so the owner writes again only once
// every receiver has its copy. Flow.NoRelay turns it off.
//
// Across nodes, the owner plans: when it lends one content to several
// nodes that serve relay requests (their advert says so), PlanRelay (pure:
// one fetch across hosts per host, one into each GPU, at most
// Flow.RelayFanout receivers per holder) over the receivers in the order
// they were lent it gives each its parent, named in its descriptor
// (Descriptor.Relay). That receiver asks its parent (a control request to
// relayTarget, with the content's key and type, never the owner's lease);
// the parent waits for its own fetch of the content to start (as long as
// a message of it that will fetch the content is received and not yet
// fetching, else relayGrace at most) and lends its copy (an export of its
// destination), whose flight is not delivered until that loan ends. The
// asker fetches the copy through the channel between the two and releases
// it, then releases the owner's lease as usual, so the owner writes again
// only once every receiver has its copy. A parent that does not hold the
// content, fails, or goes down costs the asker a fetch from the owner
// (Stats.RelayFallbacks), never a hang.
//
// Copies are streamed (Flow.NoRelayStream turns it off): the parent lends
// its copy as soon as its own fetch started, and the asker copies each
// piece once it landed there (rdma.Progress: before each piece the
// channel asks how far the parent got, a relayProgress request answered
// once the parent holds that piece; channels without rdma.StreamFetcher
// wait for the whole). Each fetch tells its flight as pieces land
// (relayFlight.land), so that receivers of the same node copy them at
// once and a parent answers its children's progress requests: the copies
// down a relay tree overlap instead of following one another, over one
// loan per copy. With streaming off, a parent lends its copy once its
// fetch ended and followers wait for the whole.
//
// Copies are pushed where that helps (Flow.NoRelayPush turns it off): a receiver
// whose parent is another node on its destination's GPU (their adverts'
// device UUIDs) lends its destination to the parent instead (an export
// held by the parent, sent in a relayPush request), and the parent writes
// its copy there piece by piece as it fills (rdma.Putter: ipc maps the
// receiver's allocation), then gives the loan back and answers. The GPU
// then runs every copy into it from the parent's one CUDA context instead
// of switching between the receivers' contexts at every piece. The
// parent's flight is not delivered until the put ended; the receiver's
// own flight is told its copy landed once the parent answered. A parent
// that cannot push (no Putter between the two, not holding the content)
// or fails costs the receiver the streamed fetch from it, and then the
// owner, as above.
//
// stats.go: Engine.Stats reports what the engine did for a node's metrics
// (package metrics): per channel and owner the transfers, bytes and fetch
// latency buckets (LatencyBounds), bytes served, failed fetches by reason,
// credit waits, budgets and leases. The paths keep plain counters; the
// snapshot is taken at scrape time.
//
// With Config.TracerProvider, ExportContext and ImportContext record the
// export of a message's tensors and each fetch (channel, bytes, and what
// the channel adds: cache hit or miss, stripes) as spans of the trace in
// their context; without one they cost nothing.
//
// A peer that ignores the window this node advertised has its messages
// refused (ErrInboxFull) and, if it goes on, its connection closed; a
// message whose tensors exceed the per-peer budget is refused
// (ErrOverBudget). Whatever a peer sends, what the receiver allocates for
// it stays within Config.Flow.ReceiveBudgetPerPeer and all peers' within
// Config.Flow.ReceiveBudget (the flow section of the node's config,
// config.FlowConfig).
//
//	e := transfer.New(transfer.Config{Node: "a", Incarnation: inc, Dial: dial})
//	_ = e.Start()
//	out, _ := e.Export("b", msg)            // nil: no tensors
//	e.Send("b", out, send, fail)            // send writes body + out.Table
//	in, _ := e.Import("a", table, msg, dev) // on the receiving node
//	if ep.Queues(in) {                      // else: deliver it now
//		_ = e.Accept("a", in, size, deliver, alone, mayBlock) // deliver(nil) once fetched
//	}
package transfer
