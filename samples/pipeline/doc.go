// Command pipeline runs a three-stage model as actors on an embedded 3-node
// cluster on loopback and checks every output against computing the stages
// in one process.
//
// Stage 1 (node0) computes a1 = relu(x·W1) and sends a1 to stage 2 (node1)
// twice: as a tensor fetched before delivery, and as a tensor.Ref. Stage 2
// computes a2 = relu(a1·W2) and forwards the Ref, unfetched, to stage 3
// (node2) with a Ref to a2. Stage 3 fetches both, a1 from node0 and a2 from
// node1, and answers the driver with y = (a2 + a1)·W3: a residual
// connection whose bytes skip the middle node. Micro-batches flow through
// the stages concurrently (--inflight, default 8).
//
//	go run ./samples/pipeline
//	go run ./samples/pipeline --batches 64 --rows 128 --dim 1024 --inflight 16
//
// It prints each micro-batch's latency and OK, the bytes each node fetched
// and over which channel, and exits with status 1 if any output differs from
// the in-process reference (compared bit for bit). --metrics-address
// host:port serves the three nodes' Prometheus metrics (package metrics). With
// OTEL_EXPORTER_OTLP_ENDPOINT set (see tracing.FromEnv) the nodes trace
// their messages and export the spans there.
package main
