// Command remote measures 64-byte actor-style messaging between two
// endpoints on loopback, side by side in one run: the raw Go TCP round trip
// (the floor), protoactor-go's gRPC remote, and every path other files add
// to extraPaths.
//
//	go run ./benchmarks/remote            # table
//	go run ./benchmarks/remote --quick    # counts / 20
//	go run ./benchmarks/remote --json     # {"bench":"remote","path":"raw-tcp","metric":"rtt_p50_us",...} per line
//	go run ./benchmarks/remote --paths tensorferry --cpuprofile cpu.out
//	go run ./benchmarks/remote --paths tensorferry --mutexprofile mutex.out   # who waited on whose lock
//
// Figures: rtt_p50_us, rtt_p99_us, rtt_min_us over --rtt-count round trips
// after a warm-up; oneway_msgs_per_s over --oneway-count messages, timed
// from the first send until the receiver has counted the last. Every
// message carries a 64-byte payload. raw-tcp's one-way figure writes through
// a 64 KiB bufio.Writer: it is the ceiling of batched writes on this host,
// not a per-message protocol. raw-tcp-handoff is raw TCP plus the goroutine
// hand-offs of an actor runtime (server reader → actor goroutine, client
// reader → waiting caller, sender → writer goroutine): the floor of a
// goroutine-per-actor design. tensorferry is two nodes of one loopback
// cluster with what the runtime offers request/response services: the
// serving actors have inline delivery (Node.WithInlineDelivery) and the
// client waits with Node.Request (which reads its reply from the
// connection itself: wire.Conn.Await). tensorferry-future is protoactor-go's
// API unchanged over tensorferry's transport (default mailboxes,
// RequestFuture); tensorferry-future-inline (RequestFuture to an actor with
// inline delivery) and tensorferry-request-mailbox (Node.Request to an
// actor with a default mailbox) each take one half of it, so that the gap
// between tensorferry and tensorferry-future splits into the client's
// protoactor future and the server's default mailbox, and
// raw-tcp-spin-detached-handoff (rawspinhandoff.go) is the floor of its two
// goroutine hand-offs over a spinning transport, beside
// raw-tcp-spin-detached; tensorferry-future-notimer is tensorferry-future
// without a timeout, so that protoactor's future arms no timer.
// tensorferry-poller is tensorferry with its spinning TCP
// readers left in the runtime's network poller (transport.read_spin_detach:
// off), to time what detaching them buys. --read-spin sets the tensorferry paths' read spin on TCP
// and shared memory (transport.read_spin; negative: off), to compare it on
// and off on one host. raw-tcp-spin and raw-tcp-spin-detached are raw-tcp's
// round trip with both ends reading with a 50 µs spin, their sockets in
// the runtime's network poller or duplicated out of it (rawspin.go): what
// the way of spinning costs, apart from the runtime above it;
// raw-tcp-wait-detached waits in poll(2) without spinning;
// raw-tcp-pollspin-detached spins on poll(2) with a zero timeout instead
// of read(2); raw-tcp-spin-detached-pause-{250,1000}ns pauses that long
// between the spin's reads.
//
// By default the paths run one after another, each measured in its own
// stretch of the run. On hosts whose raw TCP round trip changes from one
// stretch to the next (the 16-core GPU hosts have two modes, about 8 and
// 11–13 µs), --interleave N opens every path at once and times the round
// trips in N blocks alternating between the paths, so a path and its floor
// are timed over the same stretch; those figures carry "interleave": N.
// One-way rates are then measured path after path, as without it.
//
//	go run ./benchmarks/remote --paths raw-tcp,tensorferry --interleave 20
//
// Another path joins the same run from its own file of this package, with no
// change here:
//
//	func init() {
//		extraPaths = append(extraPaths, path{name: "mine", open: openMine})
//	}
//
// where open starts both ends and returns endpoints whose pinger (a Pinger:
// RoundTrip) and sender (a Sender: Send, WaitReceived) are measured by
// measureRTT and measureOneWay exactly as the built-in paths are, and whose
// close stops every goroutine it started (TestPaths checks with goleak).
package main
