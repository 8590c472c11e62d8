// Package cluster describes a tensorferry cluster and keeps track of its
// members: the configuration file (cluster name, shared secret, timing and
// transfer settings, each node's addresses, devices and disabled channels),
// membership, and liveness.
//
// # Configuration
//
// A cluster is described by a YAML file such as testdata/local3.yaml:
//
//	cluster: demo
//	secret_file: secret.key      # mode 0600; or secret_env: TF_SECRET; at least 16 bytes
//	heartbeat_interval: 500ms    # at least 10ms
//	failure_timeout: 3s          # must exceed 2 × heartbeat_interval
//	dial_timeout: 2s             # at least 10ms; transfer_timeout at least 100ms
//	max_frame_size: 16MiB        # sizes: integers or KiB/MiB/GiB suffixes
//	disable_channels: [ipc]      # channel names: [a-z][a-z0-9_-]{0,31}
//	tls:                         # optional, see TLSConfig
//	  cert_file: node.crt
//	  key_file: node.key
//	  ca_file: ca.crt
//	nodes:
//	  - name: a
//	    address: 127.0.0.1:7001  # control listener
//	    devices: [cuda:0, cuda:1]
//	  - name: b
//	    address: 127.0.0.1:7002
//	    data_address: 127.0.0.1:7202   # default: control port + 100
//
// Settings left out take the defaults of DefaultConfig; durations have the
// lower bounds MinHeartbeatInterval, MinDialTimeout, MinReconnectMin and
// MinTransferTimeout. A secret file that group or others may access is
// refused, as ssh refuses such a key, unless secret_file_insecure: true
// (for test fixtures only). Load reads, checks and completes a file; errors
// name the field and the line:
//
//	cfg, err := config.Load("/etc/tensorferry/cluster.yaml")
//	if err != nil {
//		log.Fatal(err) // cluster: config line 12: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
//	}
//	self, ok := cfg.Node("a")
//	if !ok || cfg.ChannelDisabled(self.Name, "ipc") {
//		// ...
//	}
//
// Tests build a loopback cluster in code and hand it to child processes:
//
//	cfg, err := config.LocalConfig("test", 3) // node0..node2 on free ports
//	if err != nil {
//		t.Fatal(err)
//	}
//	path, err := cfg.WriteFiles(t.TempDir()) // cluster.yaml + secret.key (0600)
//	cmd := exec.Command(bin, "-config", path, "-node", "node1")
package cluster
