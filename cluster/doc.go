// Package cluster keeps track of the members of a tensorferry cluster and
// of the authenticated control connections between them (mutual HMAC
// handshake, optionally under TLS; shared-memory rings between processes
// of one host), and accepts the data connections that peers' channels
// dial. The cluster's description — its nodes, secret, timings and the
// transport section this package runs by — is package config's
// *config.Config, read with config.Load; this package only runs it.
//
// Two memberships (config's membership key):
//
//   - mesh: one control connection to every node of the config, kept
//     open, with heartbeats on each; a lost connection is a NodeDown, and
//     it is redialed with backoff. n nodes hold n-1 connections each and
//     send n-1 heartbeats per interval: the right choice for a few nodes.
//   - gossip: liveness comes from SWIM gossip (package cluster/gossip,
//     hashicorp/memberlist, authenticated and encrypted with a key derived
//     from the secret), seeded from the config's nodes; a member's Leave
//     (dead after suspicion, gone, restarted) is the NodeDown. Control
//     connections are dialed on first use (Connect, Peer.Send) and closed
//     after transport.idle_timeout without a frame, by a goodbye in both
//     directions that loses nothing in flight and lets nothing overtake
//     (ondemand.go); the Peer, and everything that hangs on it, outlives
//     an idle close. A node that talks to few others holds few
//     connections, and background traffic per node does not grow with
//     the cluster.
//
// The default (membership left out) is the mesh up to
// config.AutoMeshNodes nodes and gossip above, and gossip with a
// discovery section.
//
// A gossip cluster may hold nodes that do not gossip: a node marked
// mesh_only in the config (a Python node, which cannot speak the
// encrypted gossip) has no gossip address; every gossiping node keeps a
// control connection to it by the mesh's rules (dialed and accepted,
// heartbeats, failure_timeout, never closed for idleness; gossip's view
// does not decide whether it is up: Peer.Mesh), and it starts no gossip
// and keeps one to every node of the config. The gossiping nodes among
// themselves run gossip as above. With a discovery section the same holds
// for a node whose registration carries the mark (a Python node always
// registers so): the gossiping nodes that find it keep a mesh connection
// to it, and it runs the mesh to every node it finds.
//
// Either runs with discovery (config section discovery, package
// discovery: etcd), which announces the nodes that register besides the
// config's: with gossip they seed the gossip; with the mesh each one
// announced is a peer like a node of the config (dialed with backoff,
// heartbeats, NodeUp), and one whose registration goes (it left, or its
// lease expired) is a NodeDown and refused until it registers again. The
// mesh with discovery (membership: mesh set) costs what the mesh costs
// and suits a few nodes: Go services with a few PyTorch processes, say
// (the Python package python/tensorferry speaks the mesh, not gossip).
//
// Settings used here: heartbeat_interval, failure_timeout, dial_timeout,
// reconnect_min, reconnect_max, membership, gossip, discovery and tls
// from the cluster part, and the transport section (max_frame_size, send_queue,
// handler_takeover, max_data_conns_per_peer, max_data_conns,
// data_idle_timeout, idle_timeout, read_spin, read_spin_detach,
// caller_reads, direct_write, shared_memory; package actor runs
// burst_decode and inline_delivery, package transfer inline_threshold and
// inline_device).
//
//	cfg, err := config.Load("cluster.yaml")
//	if err != nil {
//		log.Fatal(err) // config: line 12: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
//	}
//	m, err := cluster.NewMembership(cfg, "a", incarnation, handler, cluster.Options{Caps: caps})
//	if err != nil {
//		log.Fatal(err)
//	}
//	err = m.Start()                       // listen; dial every peer (mesh) or join the gossip
//	p, err := m.Connect(ctx, "b")         // the peer, up, with a control connection open
//	err = p.Send(ctx, wire.FrameRelease, 0, 0, &rel) // dials again after an idle close (gossip)
//	nc, err := m.DialData(ctx, "b", "staging") // an authenticated data connection for a channel
//	defer m.Close()
//
// The actor package runs a Membership for every node; NodeUp and NodeDown
// are what it publishes on the ActorSystem's EventStream.
package cluster
