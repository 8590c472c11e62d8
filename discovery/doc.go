// Package discovery tells a node which nodes make up its cluster, so that
// nodes can join and leave without anyone editing the config file.
//
// A Discovery delivers Events: a Joined for every node known when it
// starts, then a Joined or a Left (with a reason) for every change. Two
// sources exist:
//
//   - Static: the config's node list, fixed (the cluster as a file
//     describes it).
//   - NewEtcd: etcd (config section discovery.etcd). Each node registers
//     its name, addresses and devices under
//     {prefix}{cluster}/nodes/{name} with a lease of lease_ttl, kept alive
//     every third of it, and learns the others with a range and then a
//     watch from the range's revision on. A registration deleted after its
//     node marked it leaving is a Left "left"; one deleted otherwise (its
//     lease expired: the node died or was cut off from etcd) is a Left
//     "lease expired". A broken watch reconnects with backoff and goes on
//     from the last revision it applied, so nothing is missed; if etcd has
//     compacted that history it ranges again and reports the difference.
//     A node whose own lease expired registers again under a new one.
//
// FromConfig picks the one the config names. The Discovery interface is
// the extension point for other sources (Kubernetes endpoints or a
// headless service's DNS name, say): a source needs only to report
// Joined and Left in order.
//
//	d, err := discovery.FromConfig(cfg, log)
//	if err != nil {
//		return err
//	}
//	defer d.Close() // deregisters
//	err = d.Start(ctx, self, func(ev discovery.Event) {
//		switch ev.Kind {
//		case discovery.Joined:
//			members.add(ev.Node)
//		case discovery.Left:
//			members.remove(ev.Node.Name, ev.Reason)
//		}
//	})
//
// # etcd without gRPC
//
// etcd's Go client imports gRPC, which this module never does. This
// package speaks etcd's v3 API through the HTTP/JSON gateway every etcd
// server runs on its client port (paths /v3/lease/grant, /v3/kv/txn,
// /v3/kv/range, /v3/watch, ...), with net/http. What etcd answers is
// bounded (16 MiB a request or a watch batch) and each answer has a
// decoder with a fuzz target. The values under the prefix are treated as
// hostile input: at most 16 KiB, checked with config.CheckNode, and an
// invalid one is logged and skipped. etcd with TLS is reached through
// https:// endpoints (the system's roots); client certificates and etcd's
// own authentication are not supported yet.
package discovery
