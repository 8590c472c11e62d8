// Command scale measures cluster membership against the number of nodes N,
// two designs side by side in one run, all nodes in this process on
// loopback:
//
//   - mesh: package cluster's Membership as it is, every node in the
//     config, one control connection between every two nodes and a
//     heartbeat on each (a no-op Handler);
//   - gossip: package cluster/gossip (hashicorp/memberlist, SWIM with
//     suspicion), every node joining through node 0; what carries the idle
//     background traffic of membership: gossip.
//
// For each design and N it starts the nodes, waits until every node sees
// every other, then measures over an idle period (--idle): false
// NodeDowns, background messages and bytes sent per node per second,
// open descriptors (sockets) per node, CPU per node (getrusage), heap and
// goroutines per node; then the time every other node takes to report a
// node down that stops answering with its sockets open (frozen, as
// SIGSTOP or a dead host: the cluster's failure_timeout is the bound) and
// one whose sockets close (killed, as SIGKILL). Timings are the config
// defaults (heartbeat 500ms, failure_timeout 3s, gossip derived from
// failure_timeout: see config.GossipConfig).
//
// The mesh needs N×(N−1) descriptors in one process: it runs up to the
// largest N the descriptor limit allows (the soft limit is raised to the
// hard one); larger N are reported as not run.
//
//	go run ./benchmarks/scale                       # N = 16, 64, 256, 1024; table on stdout
//	go run ./benchmarks/scale -n 16,64 -idle 5s -json > scale.jsonl
//	go run ./benchmarks/scale -svg .                # also bench-scale-*.svg in the repo root
package main
