// Command ferry runs and inspects tensorferry nodes.
//
//	ferry node  --config cluster.yaml --name a            run node a until SIGINT/SIGTERM
//	ferry ping  --config cluster.yaml --from c --to a     round trips from a temporary node c to a
//	ferry bench --config cluster.yaml --from c --to a     tensor transfer bandwidth from c to a
//	ferry topo  --config cluster.yaml                     the data channel chosen for every pair, the control transport (shm/tcp), the NIC of each GPU
//	ferry top   --config cluster.yaml                     live view of the nodes' metrics (q quits)
//
// With a discovery section in the config, `ferry node` runs a node the
// file does not list: --address (and --data-address, --devices cpu,cuda:0)
// describe it, and it registers itself.
//
// node and bench serve the node's Prometheus metrics with
// --metrics-address host:port (and /debug/pprof with --pprof); top scrapes
// every node's metrics_address in the config, and the addresses of
// --targets.
//
// node and bench trace their messages when the OpenTelemetry variables ask
// for it (OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318, see
// tracing.FromEnv); bench prints a progress line on stderr when it is a
// terminal, or with --progress.
package main
