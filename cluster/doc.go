// Package cluster keeps track of the members of a tensorferry cluster: one
// authenticated control connection to every other node of the config
// (mutual HMAC handshake, optionally under TLS), heartbeats and failure
// detection, reconnection with backoff, and the data listener where peers'
// channels dial in. The cluster's description — its nodes, secret, timings
// and the transport section this package runs by — is package config's
// *config.Config, read with config.Load; this package only runs it.
//
// Settings used here: heartbeat_interval, failure_timeout, dial_timeout,
// reconnect_min, reconnect_max and tls from the cluster part, and the
// transport section (max_frame_size, send_queue, handler_takeover,
// max_data_conns_per_peer, max_data_conns, data_idle_timeout).
//
//	cfg, err := config.Load("cluster.yaml")
//	if err != nil {
//		log.Fatal(err) // config: line 12: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
//	}
//	m, err := cluster.NewMembership(cfg, "a", incarnation, handler, cluster.Options{Caps: caps})
//	if err != nil {
//		log.Fatal(err)
//	}
//	err = m.Start()                       // listen, dial every peer; handler.PeerUp / PeerDown follow
//	p, ok := m.Peer("b")                  // the peer's control connection, while it is up
//	nc, err := m.DialData(ctx, "b", "staging") // an authenticated data connection for a channel
//	defer m.Close()
//
// The actor package runs a Membership for every node; NodeUp and NodeDown
// are what it publishes on the ActorSystem's EventStream.
package cluster
