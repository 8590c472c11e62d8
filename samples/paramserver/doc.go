// Command paramserver trains linear regression with a sharded parameter
// server built from tensorferry actors.
//
// The parameter vector (float32, --dim long) is split into --shards
// contiguous ranges, each held by a PS shard actor on its node's device (a
// GPU when the node offers one). Each of --workers worker actors owns a
// slice of generated sparse data with a known solution (y = X·w* + noise),
// and every step pulls the weights from every shard, computes the gradient
// of the squared loss on its device (a GPU when its node offers one) and
// pushes one gradient tensor per shard. A worker's weights and gradient
// stay on its device: the shards' weights are fetched straight into its
// own weight tensor (actor.Node.WithDestinations), and each shard's range
// of its gradient is lent as a view, so a step allocates nothing and
// copies nothing through the host. Weights and gradients larger than 64 KiB
// travel out of band through the data channels (ipc between the GPUs of
// one host). Shards sum gradients (axpy) and apply SGD (sgd), workers
// compute X·w − y (residual) and Xᵀr (scatter): CUDA kernels on GPUs
// (ps/kernels.ptx, loaded and launched through memory.LoadModule), Go
// loops on host memory. A shard lends its weights when it answers a pull,
// and waits (Tensor.WaitReleased) before it writes them again.
//
// With --mode sync each shard applies the average of all workers' gradients
// of a step before it answers the next step's pulls; with --mode async it
// applies each gradient (scaled by 1/workers) as it arrives.
//
// With no flags, an embedded 3-node cluster on loopback (each node with its
// own listeners, so the real wire protocol and data channels are used):
// node0 holds the shards, node1 and node2 the workers (on cuda:0 and
// cuda:1 when the machine has GPUs):
//
//	go run ./samples/paramserver
//	go run ./samples/paramserver --mode async --workers 4 --shards 3
//	go run ./samples/paramserver --dim 262144 --steps 40 --json
//
// It prints the loss of every step, then the distance ‖w − w*‖/‖w*‖, the
// bytes each data channel moved (summed over the nodes, then split into
// gradients and weights) and the messages sent, and exits with status 1 when the distance is above --tol (1e-2).
// Why 1e-2: the data has 8 samples per parameter, scaled so that XᵀX/rows ≈
// I, so with the default learning rate every sync step shrinks the error by
// about 0.7 and the label noise (σ = 0.1) leaves a floor near σ/√rows ≈
// 1.5e-4 (the default run ends at 1.5e-4). A lost, duplicated or unaveraged
// update, or a stale pull, leaves the distance far above 1e-2 or diverges;
// one step alone ends at 0.39.
//
// With --config FILE --node NAME it runs one node of a real cluster. Roles
// follow the config's node list: the first ⌈n/3⌉ nodes hold the shards, the
// others run the workers (a single node runs both). The node of the first
// worker drives: it sets every node up with its own flags (only the
// driver's training flags matter), reports, and tells the others to exit.
//
//	paramserver --config cluster.yaml --node a   # on every node
//
// --dim goes up to 2^28 (1 GiB of float32); give --samples with it (the
// default, 8·dim/workers rows, would not fit), and a --tol the few rows
// can reach, e.g. --dim 268435456 --samples 1048576 --steps 5 --tol 1.
//
// With OTEL_EXPORTER_OTLP_ENDPOINT set (see tracing.FromEnv) the nodes
// trace their messages and export the spans there.
//
// --metrics-address host:port serves the Prometheus metrics of the node
// (of the three nodes, each series labelled with its node, when embedded):
// package metrics lists them.
package main
