// Command ferry runs and inspects tensorferry nodes.
//
//	ferry node  --config cluster.yaml --name a            run node a until SIGINT/SIGTERM
//	ferry ping  --config cluster.yaml --from c --to a     round trips from a temporary node c to a
//	ferry bench --config cluster.yaml --from c --to a     tensor transfer bandwidth from c to a
//	ferry topo  --config cluster.yaml                     the data channel chosen for every pair, the NIC of each GPU
package main
