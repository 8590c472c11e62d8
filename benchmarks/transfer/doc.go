// Command transfer measures tensor messages between two tensorferry nodes
// on loopback against a raw TCP socket moving the same bytes, side by side
// in one run.
//
//	go run ./benchmarks/transfer                  # 4 KiB … 1 GiB, table
//	go run ./benchmarks/transfer --quick          # up to 64 MiB, fewer repetitions
//	go run ./benchmarks/transfer --max 256MiB --json
//	go run ./benchmarks/transfer --cpuprofile cpu.out --paths tensorferry-staging --min 1GiB
//
// Two nodes of one process, each with its own control and data listeners
// (config.LocalConfig): the sender's root context sends &Msg{T: tensor}
// with RequestFuture to an actor on the other node, whose node fetches the
// tensor through the staging channel (tensors at or below the inline
// threshold, 64 KiB, ride inside the control frame) before delivering the
// message; the actor answers a small Ack. One message's time runs from
// RequestFuture until the Ack arrived; raw-tcp's from the first byte
// written on one loopback connection until the peer, having read all the
// bytes into a buffer it keeps, acked with one byte.
//
// Figures per size and path: gbps, the median over the repetitions of
// bytes / time, in GB/s (10^9 bytes per second); gbps_best, the same for
// the fastest repetition (on a loaded host, the least disturbed one); and
// us, the median time of one message. tensorferry-staging also reports fetch_gbps, the bytes
// over the median time the receiving node spent in the channel's Fetch
// (node.Stats), which leaves out the destination's allocation and the
// messaging around the fetch. raw-tcp-fresh-buffer is raw-tcp with a new
// receive buffer per message, as tensorferry allocates each destination:
// the gap between the two raw paths is the cost of that allocation. Repetitions of both paths alternate, so a load change on the
// host touches both alike. Then rtt_p50_us and rtt_p99_us of a 64-byte
// message and of a 4 KiB tensor message round trip on the same nodes.
//
// With --channel verbs two more paths time the verbs channel alone, an
// owner and a fetcher channel in one process: verbs-1-nic with one RDMA
// device, verbs-2-nics with two, each transfer split over both (slices of
// at least 256 KiB, a queue pair per device); gbps, gbps_best and us of
// the fetcher's Fetch. --src and --dst put their source tensor and
// destination on GPUs (GPUDirect RDMA; cpu by default), to compare with
// perftest's ib_read_bw --use_cuda on the same pair of GPUs (BENCHMARKS.md).
// A host with one device leaves verbs-2-nics out (said on stderr) unless
// --paths names it.
//
// Targets (issue 3): tensorferry ≥ 85 % of raw-tcp at ≥ 64 MiB; the 4 KiB
// tensor round trip ≤ 2× the 64-byte round trip. The summary lines after
// the table state both.
package main
