// Package config is the one configuration tree of a tensorferry cluster:
// the cluster part (name, shared secret, TLS, liveness timings, the nodes
// with their addresses and devices) and one section per layer, in the
// manner of hashicorp/memberlist — every field documented with its unit
// and default, DefaultConfig and the Default…Config constructors of the
// sections spelling the defaults out, LocalConfig changing a few of them
// for loopback tests, and one Validate that fills zero values and rejects
// bad ones, cross-field rules included.
//
// It is a leaf: it imports nothing of this module but memory (for
// memory.Device). cluster (membership), actor, wire, transfer, the rdma
// channels, cmd/ferry and the samples take their settings from it:
//
//	Config.Transport  TransportConfig  control connections (cluster, wire)
//	Config.Flow       FlowConfig       credits, budgets, inboxes, deadlines (transfer)
//	Config.Staging    StagingConfig    the staging channel (rdma/staging)
//	Config.IPC        IPCConfig        the CUDA IPC channel (rdma/ipc)
//	Config.Verbs      VerbsConfig      the RDMA verbs channel (rdma/verbs)
//	Config.Memory     MemoryConfig     the caching CUDA allocators (memory)
//	Config.Discovery  *DiscoveryConfig where members are learnt besides Nodes (discovery)
//	Config.Gossip     GossipConfig     gossip membership and failure detection (cluster/gossip)
//
// # The file
//
// A cluster is described by a YAML file such as testdata/local3.yaml.
// Every key, with its default:
//
//	cluster: demo                  # required; [a-zA-Z0-9._-]{1,64}
//	secret_file: secret.key        # or secret_env: TF_SECRET; ≥ 16 bytes; mode 0600
//	secret_file_insecure: false    # true accepts a group/other-readable secret file (test fixtures only)
//	heartbeat_interval: 500ms      # ≥ 10ms
//	failure_timeout: 3s            # > 2 × heartbeat_interval
//	dial_timeout: 2s               # ≥ 10ms; also bounds TLS and the handshake
//	reconnect_min: 100ms           # ≥ 1ms
//	reconnect_max: 5s              # ≥ reconnect_min
//	disable_channels: []           # channel names: [a-z][a-z0-9_-]{0,31}
//	membership: ""                 # mesh or gossip; "": mesh up to 16 nodes, gossip above or with discovery
//	tls:                           # optional, see TLSConfig
//	  cert_file: node.crt
//	  key_file: node.key
//	  ca_file: ca.crt
//	  data: false                  # true: data connections too
//	transport:
//	  max_frame_size: 16MiB        # sizes: integers or KiB/MiB/GiB suffixes; 1KiB..1GiB
//	  inline_threshold: 64KiB      # < max_frame_size
//	  inline_device: false         # true: small GPU tensors inline even to a peer of the same host
//	  send_queue: 4096             # frames
//	  handler_takeover: 10ms       # ≥ 1ms
//	  read_spin: 50us              # ≤ 1ms, or off; default by the machine (50us with ≥ 8 processors or TENSORFERRY_FASTPATHS=on)
//	  read_spin_detach: auto       # auto (on), on, off: a spinning TCP reader out of Go's poller (Linux)
//	  caller_reads: auto           # auto (on), on, off: a waiting Request reads its own reply (the read role)
//	  burst_decode: auto           # auto (on with ≥ 8 processors or TENSORFERRY_FASTPATHS=on), on, off
//	  inline_delivery: auto        # auto (on), on, off: off gives WithInlineDelivery's actors protoactor's mailbox
//	  direct_write: auto           # auto (on), on, off: off queues every frame for the connection's writer
//	  max_data_conns_per_peer: 64
//	  max_data_conns: 1024
//	  data_idle_timeout: 0s        # 0: dial_timeout
//	  shared_memory: true          # control connections between processes of a host on shared-memory rings (package shm)
//	flow:
//	  transfer_timeout: 60s        # ≥ 100ms
//	  ref_ttl: 10m
//	  max_in_flight: 64            # messages with unfetched tensors, per peer (sender)
//	  max_in_flight_bytes: 4GiB
//	  receive_budget: 0            # 0: half the smallest GPU's memory (host: a quarter), ≥ 256MiB; set: ≥ 16MiB
//	  receive_budget_per_peer: 0   # 0: half of receive_budget; ≤ receive_budget
//	  receive_window: 64           # advertised to each peer
//	  inbox_messages: 4096
//	  inbox_bytes: 256MiB
//	  relay: true                  # a node fetches content lent to several of its actors once (transfer/relay.go)
//	  relay_min_bytes: 64MiB       # smaller tensors are fetched per message, on the reader
//	  relay_fanout: 4              # receivers one holder serves per kind of link (1: chains); ≤ 64
//	  relay_stream: true           # relayed copies follow their holder's copy as it fills
//	  relay_push: true             # a holder writes the copies of receivers on its GPU (needs relay_stream, ipc)
//	staging:
//	  chunk_size: 4MiB             # ≤ 64MiB
//	  chunks_in_flight: 4          # ≤ 64
//	  max_ring_bytes: 64MiB        # ≥ chunk_size
//	  stripes: 0                   # 0: by GOMAXPROCS (4, 2 or 1); ≤ 8
//	  stripe_min: 16MiB
//	ipc:
//	  shm_dir: /dev/shm
//	  challenge_ttl: 10s
//	  copy_chunk: 64MiB
//	  copy_window: 4
//	  cancel_grace: 10s
//	  max_mappings: 256
//	  max_acquisitions: 1024
//	  idle_lanes: 8
//	  direct_margin: 1s
//	  no_direct: false
//	verbs:
//	  device: ""                   # "": the first device with a usable port
//	  port: 0                      # 0: the first usable port
//	  chunk_size: 4MiB
//	  window: 4                    # ≤ send_queue
//	  send_queue: 256
//	  cache_bytes: 1GiB
//	  cache_entries: 64
//	  stall_timeout: 10s
//	  ack_timeout: 14              # queue pair: 4.096µs × 2^14 = 67ms; ≤ 31
//	  retry_count: 7               # ≤ 7
//	  rnr_retry: 7                 # ≤ 7 (7: forever)
//	  max_rd_atomic: 16
//	  max_dest_rd_atomic: 16
//	  min_rnr_timer: 12            # ≤ 31
//	  hop_limit: 64
//	  traffic_class: 0             # RoCE QoS
//	  service_level: 0             # InfiniBand QoS; ≤ 15
//	memory:
//	  cuda_cache_bytes: 0          # 0: max(1GiB, an eighth of the device)
//	discovery:                     # optional: nodes register in etcd (package discovery)
//	  etcd:
//	    endpoints: [http://10.0.0.9:2379]  # required; http:// or https://, tried in turn
//	    prefix: /tensorferry/      # keys: {prefix}{cluster}/nodes/{name}
//	    lease_ttl: 10s             # whole seconds, 2s..1h; kept alive every ttl/3
//	    dial_timeout: 2s           # each request to etcd but the watch; ≥ 10ms
//	nodes:                         # with discovery: may be empty or list some nodes only
//	gossip:                        # membership by gossip (package cluster/gossip, memberlist)
//	  probe_interval: 250ms        # ≥ 10ms; default failure_timeout/12
//	  probe_timeout: 125ms         # < probe_interval; default probe_interval/2
//	  suspicion_mult: 3            # suspected for 3 × max(1, log10 N) × probe_interval
//	  suspicion_max_timeout_mult: 4  # × that without confirmations
//	  gossip_interval: 100ms       # ≥ 1ms; default failure_timeout/30
//	  gossip_nodes: 3              # ≤ 64
//	  push_pull_interval: 30s      # ≥ 1s; stretched beyond 32 nodes
//	  retransmit_mult: 4
//	  tcp_timeout: 2s              # push-pull, join, TCP fallback ping
//	nodes:
//	  - name: a
//	    address: 127.0.0.1:7001    # control listener
//	    data_address: 127.0.0.1:7101  # default: control port + 100
//	    gossip_address: 127.0.0.1:7201  # UDP and TCP; default: control port + 200 (none when mesh_only)
//	    mesh_only: false           # true: does not gossip (a Python node); with gossip membership the
//	                               # others keep a mesh connection to it, heartbeats on it, and it dials them all
//	    devices: [cuda:0, cuda:1]  # default [cpu]
//	    disable_channels: [verbs]  # this node only
//	    metrics_address: ""        # reserved: host:port (or :port) of the Prometheus endpoint; "": off
//	    pprof: false               # reserved: also serve net/http/pprof there
//
// membership and discovery combine freely. The mesh (one control
// connection to every node, heartbeats on each) with a discovery section
// dials the nodes of the list and every node registered in etcd, and
// takes down a node whose registration goes; n nodes hold n-1
// connections each, which suits a few nodes: Go services with a few
// PyTorch processes, say, which speak the mesh but cannot gossip. Gossip
// (the default with discovery) suits many.
//
// Settings left out take their defaults; a section may be left out whole.
// The keys max_frame_size, inline_threshold, transfer_timeout,
// receive_budget, receive_budget_per_peer, receive_window, inbox_messages,
// chunk_size and chunks_in_flight lived at the top level before the
// sections: there they are refused with the section key they moved to.
// metrics_address and pprof are reserved: read and checked, consumed by
// later work.
//
// Load reads, checks and completes a file; every error is an *Error
// naming the field and the line:
//
//	cfg, err := config.Load("/etc/tensorferry/cluster.yaml")
//	if err != nil {
//		log.Fatal(err) // config: line 12: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
//	}
//	self, ok := cfg.Node("a")
//	if !ok || cfg.ChannelDisabled(self.Name, "ipc") {
//		// ...
//	}
//
// In code, start from DefaultConfig and validate:
//
//	cfg := config.DefaultConfig()
//	cfg.Cluster, cfg.SecretEnv = "demo", "TF_SECRET"
//	cfg.Nodes = []config.NodeConfig{{Name: "a", Address: "10.0.0.1:7001"}}
//	cfg.Staging.Stripes = 2
//	err := cfg.Validate()
//
// Tests build a loopback cluster and hand it to child processes:
//
//	cfg, err := config.LocalConfig("test", 3) // node0..node2 on free ports
//	if err != nil {
//		t.Fatal(err)
//	}
//	path, err := cfg.WriteFiles(t.TempDir()) // cluster.yaml + secret.key (0600)
//	cmd := exec.Command(bin, "-config", path, "-node", "node1")
package config
