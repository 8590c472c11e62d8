// Package staging is the data channel that works between any two nodes: the
// fetcher pulls an export's bytes over dedicated data connections (never the
// control connection), in chunks (Env.Staging.ChunkSize, default 4 MiB),
// with Env.Staging.ChunksInFlight chunks staged ahead per transfer; an
// owner's ring per connection is bounded by Env.Staging.MaxRingBytes. The
// node fills Env.Staging from the staging section of its config
// (config.StagingConfig).
//
// The wire format is a fixed binary framing (see Framer): a 16-byte header
// and a REQUEST, DATA, END, ERROR or CANCEL body. It is the same for host and
// device memory: for a device-memory export the owner copies chunks to
// host staging buffers while earlier chunks are on the socket, and the
// fetcher copies chunks to a device destination while it reads the next.
// Host destinations are read straight from the socket, without a copy.
// The host staging buffers of a connection are one pinned ring (ring.go),
// allocated once on the NUMA node of the GPU it serves
// (memory.PinnedAllocator.AllocOnNode; again only if the connection moves
// to a GPU of another node), so that neither the GPU's DMA nor the
// socket copies cross the socket interconnect.
//
// The owner serves only ids found in its Store, checks every request against
// the export's bounds, and reports a bad request (unknown or released id,
// wrong lease, stale incarnation, range outside the export) to that transfer
// only: the connection stays up. Transfers of at least
// Env.Staging.StripeMin bytes are striped over Env.Staging.Stripes pooled
// connections (by default up to 4 on hosts with cores to spare). The package registers
// its backend ("staging", always viable) with rdma.Register (backend.go).
//
//	ch, _ := staging.New(env)        // env.Dial reaches other nodes' listeners
//	ch.ServeConn(conn, peer)         // a data connection a peer's channel dialled (returns at once)
//	err := ch.Fetch(ctx, d, dst)     // d from a message, dst on any device
package staging
