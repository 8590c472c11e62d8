// Package gossip is a node's membership in a cluster by gossip, a thin
// wrapper of hashicorp/memberlist: SWIM failure detection with suspicion
// and Lifeguard's local health, as Consul and Serf run it on clusters of
// thousands, instead of a control connection and heartbeats between every
// two nodes. Each member probes one other per probe interval and gossips
// news to a few, so that the traffic and connections of a node do not grow
// with the cluster; a node that stops answering is suspected, then
// declared dead unless it refutes (see config.GossipConfig for the
// timings and the detection bound).
//
// What it adds to memberlist:
//
//   - Traffic authenticated and encrypted (AES-256-GCM) with a key derived
//     from the cluster secret with HKDF-SHA256, and labelled
//     "tensorferry/<cluster>": nodes of another cluster or secret never
//     join, and bytes from anyone else are dropped.
//   - Member: a node's name, its incarnation (its process start, which
//     memberlist does not know), control, data and gossip addresses,
//     published in memberlist's node meta (a msgpack array; a meta that
//     does not decode keeps its node out, logged once).
//   - Events: Join and Leave from one goroutine, in order per node,
//     coalesced per node in a queue that never blocks memberlist and never
//     drops a Leave. A restarted node (a higher incarnation) is a Leave of
//     the old incarnation ("restarted as incarnation N") then a Join; a
//     lower incarnation never displaces a higher one. A node that leaves
//     gracefully is a Leave with reason "left" a few gossip intervals
//     later; a failed one "dead: ..." after detection.
//   - Its own UDP and TCP transport in place of memberlist's NetTransport:
//     a packet is handed over in a buffer of its size (NetTransport's 64 KiB
//     per packet made the collector starve the probes of a process of
//     hundreds of nodes into false deaths), streams are closed at Shutdown,
//     and Stats count the traffic at the network.
//   - memberlist's logs in zap.
//
// Package gossiptest freezes a node (it stops answering without closing its
// sockets) for tests and benchmarks.
//
//	g, err := gossip.Start(gossip.Config{
//		Cluster: cfg.Cluster,
//		Secret:  cfg.Secret,
//		Self: gossip.Member{Name: self.Name, Incarnation: inc, Address: self.Address,
//			DataAddress: self.DataAddress, GossipAddress: self.GossipAddress},
//		Gossip: cfg.Gossip,
//		Logger: logger,
//	}, events) // events.Join / events.Leave: NodeUp / NodeDown
//	if err != nil {
//		return err
//	}
//	defer g.Shutdown()
//	n, err := g.Join(seeds) // other nodes' gossip addresses; unreachable ones are skipped
//	...
//	g.Leave(time.Second) // on a clean exit: the others see Leave(self, "left")
package gossip
