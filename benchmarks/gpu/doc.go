// Command gpu measures GPU tensors moving between GPUs and processes on one
// host, side by side with the baselines of issue 4, sizes 4 KiB … 1 GiB.
// It runs on the GPU machine; elsewhere it prints why it skipped and exits 0.
//
//	gpu --mode all --out $OUT          # everything; JSON lines in $OUT/gpu.jsonl
//	gpu --mode peer                    # cuMemcpyPeer GPU0 → GPU1, one process: the ceiling
//	gpu --mode ipc                     # actor messages GPU0 → GPU1 between two processes
//	gpu --mode ipc --dst 0             # both processes on GPU0 (the default on a one-GPU host)
//	gpu --mode staging                 # GPU → TCP loopback → GPU vs raw TCP vs the naive sequence
//	gpu --mode regcache                # first vs repeated transfer of one buffer
//	gpu --mode peer --max 256MiB --reps 20 --json
//	gpu --mode ipc --nccl nccl.txt     # also states the NCCL target from nccl_sendrecv.py's output
//	gpu --mode reuse --min 4MiB        # GPU0 → GPU1 into the receiver's own tensor vs a new one
//	gpu --mode psexchange --gpus 2 --ps-sizes 256MiB,1GiB   # a PS step's exchange, one process per GPU
//	gpu --mode fanout --receivers 3 --min 16MiB --max 1GiB  # one tensor to 3 actors on GPU1, relay on and off
//	gpu --mode fanout --receiver-nodes 1,1,1 --min 16MiB    # the same to 3 nodes of their own on GPU1
//	gpu --mode fanout --receiver-nodes 1,2,3 --relay-fanout 1 --relay-whole=false  # a chain, streamed, and no relay
//	gpu --mode fanout --receiver-nodes 1,1,1 --relay-push --relay-whole=false  # pushed by the holder, streamed, no relay
//
// Modes and their paths (the "path" of each JSON line):
//
//   - peer: cuMemcpyPeer — cuMemcpyPeerAsync (memory.Stream.CopyAsync)
//     from a cuda:0 allocation to a cuda:1 one with peer access enabled,
//     timed with timing events (memory.ElapsedTime) around a batch of copies
//     (as many as make 64 MiB, 1 to 100), per copy, median of the batches.
//   - ipc: tensorferry-ipc — two processes (this program re-executes itself
//     as the receiver): node0 owns a tensor on cuda:0 and sends &Msg{T: t}
//     with Node.Request to an actor of node1 whose tensors live on cuda:1;
//     node1 fetches the tensor through whatever channel the two nodes select
//     (ipc when it runs and NVML reports P2P) and delivers the message; the
//     actor answers an Ack. Time: Request until the Ack. The channel
//     that carried the bytes is in each line's "channel" (node.Stats).
//     --dst may name --src's GPU: two processes on one GPU. In the same
//     run, before the receiver process starts, the floor of each size:
//     copy+sync — in this process, one memory.Copy of the size from a
//     --src buffer to a --dst one (a copy and its stream synchronization);
//     raw-tcp-rtt — a 64-byte round trip over a raw loopback TCP
//     connection; floor — the sum of their medians; and x_floor — the
//     message path's median over the floor (target ≤ 2×, stated in the
//     summary). The same two are measured again beside the messages,
//     alternating with them (copy+sync-beside, raw-tcp-rtt-beside): what
//     the receiver's CUDA context and spinning node cost a neighbour.
//   - contexts: what a second process's CUDA context on the same GPU costs
//     a neighbour's copy+sync: alone; beside an idle context
//     (copy+sync-idle-context); beside one that copies 4 KiB every
//     millisecond (-ticking-context); beside one that copies in a loop
//     (-busy-context); and taking turns with one, each process copying
//     right after the other as the two ends of a message do
//     (copy+sync-taking-turns: the round of both copies). Without MPS, the
//     two contexts time-slice the GPU: a turn pays two context switches.
//   - staging: tensorferry-staging-gpu — the same with ipc and verbs
//     disabled in the config, so bytes go GPU → pinned ring → TCP loopback →
//     pinned ring → GPU; raw-tcp — one loopback connection moving the same
//     bytes from host memory into a host buffer the receiver keeps; naive —
//     in this process, a device to host memory.Copy into pageable memory,
//     the bytes over the raw TCP connection, a host to device memory.Copy on
//     the receiving side, one after the other.
//   - regcache: tensorferry-staging-gpu first_ms and repeat_ms — the first
//     transfer of a tensor on fresh nodes (it dials the data connection and
//     allocates the pinned rings) and the median of the following ones;
//     regcache-h2d — a pageable host buffer registered through
//     memory.RegCache and a HostRegistrar, then copied to cuda:0 on a
//     memory.Stream (cuMemcpyHtoDAsync and a synchronize): the first copy (miss: cuMemHostRegister paid),
//     repeated copies (hits), the registration alone, the same copy from an
//     unregistered buffer (pageable_ms), and the cache's hit and miss
//     counters.
//   - reuse: tensorferry-reuse and tensorferry-alloc — the ipc mode's
//     messages, one at a time, 4 MiB to 1 GiB, to two actors of the
//     receiving process, alternating: one fetches into a destination it
//     keeps (Node.WithDestinations, one tensor per shape), the other into a
//     tensor the node allocates (from the CUDA allocator's cache), freed
//     after use. Target: reuse ≤ 1.1× NCCL send/recv into a preallocated
//     tensor (nccl_sendrecv.py) at ≥ 16 MiB.
//   - psexchange: tensorferry-psexchange-Ngpu — one process per GPU (--gpus,
//     default all; this program re-executes itself), each with a shard and
//     a worker actor on its GPU. P (--ps-sizes) bytes of float32 split in N
//     ranges; a step: every worker lends each shard its gradient's range
//     (a view) and asks for every shard's weights; a shard answers once
//     every worker's gradient of the step is in, lending its weights; the
//     workers fetch them into views of their own weights. Time: from the
//     steps' start until every worker holds every shard's weights (the
//     traffic of an allreduce of P; no arithmetic). The first step checks
//     every byte. Target: ≤ 1.25× NCCL allreduce of P on the same GPUs
//     (nccl_collectives.py; scripts/gpu/multi.sh collectives runs both).
//   - fanout: tensorferry-fanout-relay, -relay-whole and -norelay — two
//     processes as in ipc, the receiving node with --receivers sink actors
//     (default 3) on --dst; node0 lends one tensor on --src to all of them
//     at once (a RequestFuture each, every first message checked by
//     CRC-32). Time: the first request until the last Ack, every receiver
//     holding its own copy; gbps counts the bytes delivered in all (size ×
//     receivers). Relay on (flow.relay, the default): the receiving node
//     fetches the content once and copies it on --dst for the other
//     receivers (channel "relay" in the line); off: each receiver fetches
//     from the owner. -relay-push (the defaults; unless
//     --relay-push=false, run first) has the holder write the copies of
//     the receivers on its GPU (flow.relay_push; only -nodes runs name a
//     holder, so only they push); -relay streams without push
//     (flow.relay_stream: copies follow their source as it fills);
//     -relay-whole (unless --relay-whole=false) waits for whole copies. Each setting has its
//     own pair of processes, in that order. Compare with NCCL broadcast
//     to one rank of the same size.
//     With --receiver-nodes (e.g. 1,1,1 or 1,2,3): tensorferry-fanout-
//     nodes-relay, -relay-push, -relay-whole and -norelay, one receiving process (one node, one sink)
//     per ordinal listed; with relay on, the owner names in each
//     descriptor the receiver to fetch from (transfer.PlanRelay: one fetch
//     into each GPU, the others copy from it). Compare with NCCL
//     broadcast to one rank (same GPU) or to every GPU listed.
//
// Figures: gbps is bytes / median time in GB/s (10^9 bytes per second), us
// the median time of one transfer; the actor paths also report fetch_gbps,
// the bytes over the median time the receiving node spent in the channel's
// Fetch. CUDA is reached through package memory only. The NCCL baseline is ../shared/peers/nccl_sendrecv.py, run in the
// same session; benchmarks/plot reads its output and this program's.
package main
