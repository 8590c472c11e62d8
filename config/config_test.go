package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

const testSecret = "0123456789abcdef0123456789abcdef"

// secretDir returns a directory holding secret.key with content.
func secretDir(t testing.TB, content string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret.key"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// public returns a copy of c without the unexported bookkeeping, to compare.
func public(c *Config) Config {
	cp := *c
	cp.lines, cp.dir = nil, ""
	return cp
}

// base is a minimal valid config; line numbers of the cases below count from it.
const base = `cluster: demo
secret_file: secret.key
nodes:
  - name: a
    address: 127.0.0.1:7001
  - name: b
    address: 127.0.0.1:7002
`

// everySetting sets every key of the file, each to a value other than its
// default.
const everySetting = `cluster: x.y_z-1
secret_file: secret.key
heartbeat_interval: 100ms
failure_timeout: 1s
dial_timeout: 3s
reconnect_min: 1ms
reconnect_max: 1m
membership: gossip
disable_channels: [ipc, verbs, nvlink_p2p-2]
nodes:
  - name: n0
    address: "[::1]:9000"
    data_address: localhost:9999
    devices: [cuda:0, cuda:3, pinned, cpu]
    disable_channels: [staging]
    metrics_address: :9100
    pprof: true
transport:
  max_frame_size: 1GiB
  inline_threshold: 1024
  inline_device: true
  send_queue: 16
  handler_takeover: 1ms
  read_spin: 20us
  read_spin_detach: off
  caller_reads: off
  burst_decode: on
  inline_delivery: false
  direct_write: off
  max_data_conns_per_peer: 2
  max_data_conns: 3
  data_idle_timeout: 4s
  idle_timeout: 40s
  shared_memory: false
flow:
  transfer_timeout: 2h
  ref_ttl: 1h
  max_in_flight: 5
  max_in_flight_bytes: 6MiB
  receive_budget: 7GiB
  receive_budget_per_peer: 1GiB
  receive_window: 8
  inbox_messages: 9
  inbox_bytes: 10KiB
  relay: false
  relay_min_bytes: 1MiB
  relay_fanout: 2
  relay_stream: false
  relay_push: false
staging:
  chunk_size: 512 KiB
  chunks_in_flight: 16
  max_ring_bytes: 8MiB
  stripes: 3
  stripe_min: 32MiB
  idle_timeout: 41s
ipc:
  shm_dir: /tmp
  challenge_ttl: 11s
  copy_chunk: 12MiB
  copy_window: 13
  cancel_grace: 14s
  max_mappings: 15
  max_acquisitions: 16
  idle_lanes: 17
  direct_margin: 18ms
  no_direct: true
verbs:
  device: mlx5_0
  port: 2
  chunk_size: 2MiB
  window: 19
  send_queue: 20
  cache_bytes: 21MiB
  cache_entries: 22
  stall_timeout: 23s
  ack_timeout: 18
  retry_count: 6
  rnr_retry: 5
  max_rd_atomic: 8
  max_dest_rd_atomic: 4
  min_rnr_timer: 20
  hop_limit: 3
  traffic_class: 106
  service_level: 2
memory:
  cuda_cache_bytes: 24GiB
`

func TestParseValid(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, c *Config)
	}{
		{"defaults", base, func(t *testing.T, c *Config) {
			want := DefaultConfig()
			want.Cluster = "demo"
			want.SecretFile = "secret.key"
			want.Secret = []byte(testSecret)
			want.Nodes = []NodeConfig{
				{Name: "a", Address: "127.0.0.1:7001", DataAddress: "127.0.0.1:7101", GossipAddress: "127.0.0.1:7201", Devices: []memory.Device{memory.CPU}},
				{Name: "b", Address: "127.0.0.1:7002", DataAddress: "127.0.0.1:7102", GossipAddress: "127.0.0.1:7202", Devices: []memory.Device{memory.CPU}},
			}
			want.Gossip = DefaultGossipConfig(want.FailureTimeout)
			if got := public(c); !reflect.DeepEqual(got, *want) {
				t.Errorf("got  %+v\nwant %+v", got, *want)
			}
		}},
		{"every setting", everySetting, func(t *testing.T, c *Config) {
			wantSections := struct {
				T TransportConfig
				F FlowConfig
				S StagingConfig
				I IPCConfig
				V VerbsConfig
				M MemoryConfig
			}{
				TransportConfig{MaxFrameSize: 1 << 30, InlineThreshold: 1024, InlineDevice: true, SendQueue: 16, HandlerTakeover: time.Millisecond, ReadSpin: 20 * time.Microsecond,
					ReadSpinDetach: SwitchOff, CallerReads: SwitchOff, BurstDecode: SwitchOn, InlineDelivery: SwitchOff, DirectWrite: SwitchOff,
					MaxDataConnsPerPeer: 2, MaxDataConns: 3, DataIdleTimeout: 4 * time.Second, IdleTimeout: 40 * time.Second, SharedMemory: false},
				FlowConfig{TransferTimeout: 2 * time.Hour, RefTTL: time.Hour, MaxInFlight: 5, MaxInFlightBytes: 6 << 20,
					ReceiveBudget: 7 << 30, ReceiveBudgetPerPeer: 1 << 30, ReceiveWindow: 8, InboxMessages: 9, InboxBytes: 10 << 10, NoRelay: true, RelayMinBytes: 1 << 20, RelayFanout: 2, NoRelayStream: true, NoRelayPush: true},
				StagingConfig{ChunkSize: 512 << 10, ChunksInFlight: 16, MaxRingBytes: 8 << 20, Stripes: 3, StripeMin: 32 << 20, IdleTimeout: 41 * time.Second},
				IPCConfig{ShmDir: "/tmp", ChallengeTTL: 11 * time.Second, CopyChunk: 12 << 20, CopyWindow: 13, CancelGrace: 14 * time.Second,
					MaxMappings: 15, MaxAcquisitions: 16, IdleLanes: 17, DirectMargin: 18 * time.Millisecond, NoDirect: true},
				VerbsConfig{Device: "mlx5_0", Port: 2, ChunkSize: 2 << 20, Window: 19, SendQueue: 20, CacheBytes: 21 << 20,
					CacheEntries: 22, StallTimeout: 23 * time.Second, AckTimeout: 18, RetryCount: 6, RNRRetry: 5,
					MaxRdAtomic: 8, MaxDestRdAtomic: 4, MinRNRTimer: 20, HopLimit: 3, TrafficClass: 106, ServiceLevel: 2},
				MemoryConfig{CUDACacheBytes: 24 << 30},
			}
			if c.Transport != wantSections.T || c.Flow != wantSections.F || c.Staging != wantSections.S ||
				c.IPC != wantSections.I || c.Verbs != wantSections.V || c.Memory != wantSections.M {
				t.Errorf("sections:\n%+v\n%+v\n%+v\n%+v\n%+v\n%+v\nwant %+v", c.Transport, c.Flow, c.Staging, c.IPC, c.Verbs, c.Memory, wantSections)
			}
			if c.Membership != MembershipGossip || c.MembershipMode() != MembershipGossip {
				t.Errorf("membership %q (%q)", c.Membership, c.MembershipMode())
			}
			if n := c.Nodes[0]; n.MetricsAddress != ":9100" || !n.Pprof {
				t.Errorf("metrics %q, pprof %v", n.MetricsAddress, n.Pprof)
			}
			if c.HeartbeatInterval != 100*time.Millisecond || c.FailureTimeout != time.Second ||
				c.DialTimeout != 3*time.Second || c.ReconnectMin != time.Millisecond ||
				c.ReconnectMax != time.Minute {
				t.Errorf("durations: %+v", c)
			}
			n := c.Nodes[0]
			if n.Address != "[::1]:9000" || n.DataAddress != "localhost:9999" {
				t.Errorf("addresses: %q %q", n.Address, n.DataAddress)
			}
			if want := []memory.Device{memory.CUDA(0), memory.CUDA(3), memory.Pinned, memory.CPU}; !reflect.DeepEqual(n.Devices, want) {
				t.Errorf("devices %v, want %v", n.Devices, want)
			}
			for _, tc := range []struct {
				node, ch string
				want     bool
			}{
				{"n0", "ipc", true}, {"n0", "verbs", true}, {"n0", "staging", true}, {"n0", "local", false},
				{"other", "staging", false}, {"other", "ipc", true}, {"other", "nvlink_p2p-2", true},
			} {
				if got := c.ChannelDisabled(tc.node, tc.ch); got != tc.want {
					t.Errorf("ChannelDisabled(%q, %q) = %v, want %v", tc.node, tc.ch, got, tc.want)
				}
			}
		}},
		{"null values take defaults", `cluster: demo
secret_file: secret.key
heartbeat_interval:
disable_channels:
nodes:
  - name: a
    address: 127.0.0.1:7001
    devices: ~
`, func(t *testing.T, c *Config) {
			if c.HeartbeatInterval != 500*time.Millisecond || c.DisableChannels != nil || len(c.Nodes[0].Devices) != 1 {
				t.Errorf("got %+v", c)
			}
		}},
		{"lowest bounds", `cluster: demo
secret_file: secret.key
heartbeat_interval: 10ms
failure_timeout: 21ms
dial_timeout: 10ms
reconnect_min: 1ms
reconnect_max: 1ms
disable_channels: [a, a0123456789_-abcdefghijklmnopqrs]
flow:
  transfer_timeout: 100ms
nodes:
  - name: a
    address: 127.0.0.1:7001
`, func(t *testing.T, c *Config) {
			if c.HeartbeatInterval != MinHeartbeatInterval || c.DialTimeout != MinDialTimeout ||
				c.ReconnectMin != MinReconnectMin || c.Flow.TransferTimeout != MinTransferTimeout {
				t.Errorf("got %+v", c)
			}
		}},
		{"anchors", `cluster: demo
secret_file: secret.key
nodes:
  - name: a
    address: 127.0.0.1:7001
    devices: &gpus [cuda:0, cuda:1]
  - name: b
    address: 127.0.0.1:7002
    devices: *gpus
`, func(t *testing.T, c *Config) {
			if !reflect.DeepEqual(c.Nodes[1].Devices, []memory.Device{memory.CUDA(0), memory.CUDA(1)}) {
				t.Errorf("devices %v", c.Nodes[1].Devices)
			}
		}},
	}
	dir := secretDir(t, testSecret+"\n")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), dir)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name, yaml, want string
		secret           string // content of secret.key; testSecret when empty
	}{
		{"duplicate address", strings.Replace(base, "7002", "7001", 1),
			`config: line 7: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")`, ""},
		{"duplicate name", strings.Replace(base, "name: b", "name: a", 1),
			`config: line 6: nodes[1].name: duplicate of nodes[0] ("a")`, ""},
		{"address is another's data address", strings.Replace(base, "7001\n", "7001\n    data_address: 127.0.0.1:7002\n", 1),
			`config: line 8: nodes[1].address: duplicate of nodes[0].data_address ("127.0.0.1:7002")`, ""},
		{"address is another's default data address", strings.Replace(base, "7002", "7101", 1),
			`config: line 7: nodes[1].address: duplicate of nodes[0].data_address ("127.0.0.1:7101")`, ""},
		{"data address is own address", strings.Replace(base, "7001\n", "7001\n    data_address: 127.0.0.1:7001\n", 1),
			`config: line 6: nodes[0].data_address: duplicate of nodes[0].address ("127.0.0.1:7001")`, ""},
		{"data address duplicate", strings.Replace(base, "7002\n", "7002\n    data_address: 127.0.0.1:7101\n", 1),
			`config: line 8: nodes[1].data_address: duplicate of nodes[0] ("127.0.0.1:7101")`, ""},
		{"unknown membership", strings.Replace(base, "nodes:", "membership: swim\nnodes:", 1),
			`config: line 3: membership: "swim" is not a membership: use "mesh" or "gossip" (or leave it out)`, ""},
		{"idle timeout too short", strings.Replace(base, "nodes:", "transport:\n  idle_timeout: 1ms\nnodes:", 1),
			`config: line 4: transport.idle_timeout: `, ""},
		{"unknown key", strings.Replace(base, "nodes:", "heartbeat: 1s\nnodes:", 1),
			`config: line 3: heartbeat: unknown key`, ""},
		{"unknown node key", strings.Replace(base, "    address: 127.0.0.1:7002", "    adress: 127.0.0.1:7002", 1),
			`config: line 7: nodes[1].adress: unknown key`, ""},
		{"duplicate key", "cluster: a\n" + base,
			`config: line 2: cluster: duplicate key`, ""},
		{"duration without unit", strings.Replace(base, "nodes:", "failure_timeout: 3\nnodes:", 1),
			`config: line 3: failure_timeout: bad duration "3": want a Go duration`, ""},
		{"negative duration", strings.Replace(base, "nodes:", "dial_timeout: -1s\nnodes:", 1),
			`config: line 3: dial_timeout: must be positive, got "-1s"`, ""},
		{"duration is a list", strings.Replace(base, "nodes:", "dial_timeout: [1s]\nnodes:", 1),
			`config: line 3: dial_timeout: want a single value, got a list`, ""},
		{"failure timeout too short", strings.Replace(base, "nodes:", "heartbeat_interval: 500ms\nfailure_timeout: 1s\nnodes:", 1),
			`config: line 4: failure_timeout: 1s must exceed 2 × heartbeat_interval (500ms)`, ""},
		{"failure timeout below default heartbeat", strings.Replace(base, "nodes:", "failure_timeout: 900ms\nnodes:", 1),
			`config: line 3: failure_timeout: 900ms must exceed 2 × heartbeat_interval (500ms)`, ""},
		{"reconnect max below min", strings.Replace(base, "nodes:", "reconnect_min: 1s\nreconnect_max: 10ms\nnodes:", 1),
			`config: line 4: reconnect_max: 10ms is below reconnect_min (1s)`, ""},
		{"bad size unit", strings.Replace(base, "nodes:", "transport:\n  max_frame_size: 16MB\nnodes:", 1),
			`config: line 4: transport.max_frame_size: bad size "16MB": want bytes as an integer or with a KiB, MiB or GiB suffix`, ""},
		{"negative size", strings.Replace(base, "nodes:", "staging:\n  chunk_size: -1\nnodes:", 1),
			`config: line 4: staging.chunk_size: bad size "-1"`, ""},
		{"zero size", strings.Replace(base, "nodes:", "staging:\n  chunk_size: 0KiB\nnodes:", 1),
			`config: line 4: staging.chunk_size: must be positive, got "0KiB"`, ""},
		{"huge size", strings.Replace(base, "nodes:", "staging:\n  chunk_size: 9223372036854775807GiB\nnodes:", 1),
			`config: line 4: staging.chunk_size: size "9223372036854775807GiB" is too large`, ""},
		{"frame too large", strings.Replace(base, "nodes:", "transport:\n  max_frame_size: 2GiB\nnodes:", 1),
			`config: line 4: transport.max_frame_size: 2147483648 bytes is outside 1KiB..1GiB`, ""},
		{"inline not below frame", strings.Replace(base, "nodes:", "transport:\n  max_frame_size: 64KiB\n  inline_threshold: 64KiB\nnodes:", 1),
			`config: line 5: transport.inline_threshold: 65536 bytes must be below max_frame_size (65536)`, ""},
		{"zero chunks in flight", strings.Replace(base, "nodes:", "staging:\n  chunks_in_flight: 0\nnodes:", 1),
			`config: line 4: staging.chunks_in_flight: bad count "0": want a positive integer`, ""},
		{"too many chunks in flight", strings.Replace(base, "nodes:", "staging:\n  chunks_in_flight: 5000\nnodes:", 1),
			`config: line 4: staging.chunks_in_flight: 5000 is outside 1..64`, ""},
		{"moved key", strings.Replace(base, "nodes:", "chunk_size: 4MiB\nnodes:", 1),
			`config: line 3: chunk_size: moved to staging.chunk_size (a key of the staging section)`, ""},
		{"unknown section key", strings.Replace(base, "nodes:", "staging:\n  chunk: 4MiB\nnodes:", 1),
			`config: line 4: staging.chunk: unknown key`, ""},
		{"section not a mapping", strings.Replace(base, "nodes:", "flow: 3\nnodes:", 1),
			`config: line 3: flow: want a mapping of keys, got "3"`, ""},
		{"duplicate section key", strings.Replace(base, "nodes:", "ipc:\n  copy_window: 2\n  copy_window: 3\nnodes:", 1),
			`config: line 5: ipc.copy_window: duplicate key`, ""},
		{"shared_memory not a bool", strings.Replace(base, "nodes:", "transport:\n  shared_memory: on\nnodes:", 1),
			`config: line 4: transport.shared_memory: want true or false, got "on"`, ""},
		{"read spin above maximum", strings.Replace(base, "nodes:", "transport:\n  read_spin: 2ms\nnodes:", 1),
			`config: line 4: transport.read_spin: 2ms is above the maximum of 1ms`, ""},
		{"read spin not a duration", strings.Replace(base, "nodes:", "transport:\n  read_spin: fast\nnodes:", 1),
			`config: line 4: transport.read_spin: bad duration "fast"`, ""},
		{"fast path switch not a switch", strings.Replace(base, "nodes:", "transport:\n  burst_decode: sometimes\nnodes:", 1),
			`config: line 4: transport.burst_decode: want auto, on or off, got "sometimes"`, ""},
		{"handler takeover below minimum", strings.Replace(base, "nodes:", "transport:\n  handler_takeover: 10us\nnodes:", 1),
			`config: line 4: transport.handler_takeover: 10µs is below the minimum of 1ms`, ""},
		{"per-peer budget above budget", strings.Replace(base, "nodes:", "flow:\n  receive_budget: 1GiB\n  receive_budget_per_peer: 2GiB\nnodes:", 1),
			`config: line 5: flow.receive_budget_per_peer: 2GiB is above receive_budget (1GiB)`, ""},
		{"receive budget below minimum", strings.Replace(base, "nodes:", "flow:\n  receive_budget: 1\nnodes:", 1),
			`config: line 4: flow.receive_budget: 1 is below 16MiB (0 derives it from the node's memory)`, ""},
		{"ref ttl not a duration", strings.Replace(base, "nodes:", "flow:\n  ref_ttl: forever\nnodes:", 1),
			`config: line 4: flow.ref_ttl: bad duration "forever"`, ""},
		{"staging chunk above protocol limit", strings.Replace(base, "nodes:", "staging:\n  chunk_size: 65MiB\n  max_ring_bytes: 1GiB\nnodes:", 1),
			`config: line 4: staging.chunk_size: 68157440 bytes is outside 1..64MiB`, ""},
		{"ring below chunk", strings.Replace(base, "nodes:", "staging:\n  chunk_size: 8MiB\n  max_ring_bytes: 4MiB\nnodes:", 1),
			`config: line 5: staging.max_ring_bytes: 4MiB is below chunk_size (8MiB)`, ""},
		{"too many stripes", strings.Replace(base, "nodes:", "staging:\n  stripes: 9\nnodes:", 1),
			`config: line 4: staging.stripes: 9 is outside 0..8`, ""},
		{"ipc copy chunk too small", strings.Replace(base, "nodes:", "ipc:\n  copy_chunk: 1KiB\nnodes:", 1),
			`config: line 4: ipc.copy_chunk: 1024 bytes is outside 4KiB..1GiB`, ""},
		{"ipc no_direct not a bool", strings.Replace(base, "nodes:", "ipc:\n  no_direct: 1\nnodes:", 1),
			`config: line 4: ipc.no_direct: want true or false, got "1"`, ""},
		{"verbs window above send queue", strings.Replace(base, "nodes:", "verbs:\n  send_queue: 8\n  window: 9\nnodes:", 1),
			`config: line 5: verbs.window: 9 is above send_queue (8)`, ""},
		{"verbs bad port", strings.Replace(base, "nodes:", "verbs:\n  port: 256\nnodes:", 1),
			`config: line 4: verbs.port: bad port "256": want 1..255`, ""},
		{"verbs retry count above 7", strings.Replace(base, "nodes:", "verbs:\n  retry_count: 8\nnodes:", 1),
			`config: line 4: verbs.retry_count: 8 is outside 0..7`, ""},
		{"verbs traffic class above a byte", strings.Replace(base, "nodes:", "verbs:\n  traffic_class: 256\nnodes:", 1),
			`config: line 4: verbs.traffic_class: bad value "256": want an integer in 0..255`, ""},
		{"memory negative cache", strings.Replace(base, "nodes:", "memory:\n  cuda_cache_bytes: -1\nnodes:", 1),
			`config: line 4: memory.cuda_cache_bytes: bad size "-1"`, ""},
		{"bad metrics address", strings.Replace(base, "7001\n", "7001\n    metrics_address: localhost\n", 1),
			`config: line 6: nodes[0].metrics_address: "localhost": want host:port`, ""},
		{"metrics address is another's address", strings.Replace(base, "7001\n", "7001\n    metrics_address: 127.0.0.1:7002\n", 1),
			`config: line 8: nodes[1].address: duplicate of nodes[0].metrics_address ("127.0.0.1:7002")`, ""},
		{"pprof without metrics address", strings.Replace(base, "7001\n", "7001\n    pprof: true\n", 1),
			`config: line 6: nodes[0].pprof: pprof is served on metrics_address: set it too`, ""},
		{"channel name with upper case", strings.Replace(base, "nodes:", "disable_channels:\n  - ipc\n  - RDMA\nnodes:", 1),
			`config: line 5: disable_channels[1]: bad channel name "RDMA": want a lower-case letter, then up to 31 of [a-z0-9_-]`, ""},
		{"channel name starting with a digit", strings.Replace(base, "nodes:", "disable_channels: [9p]\nnodes:", 1),
			`config: line 3: disable_channels[0]: bad channel name "9p"`, ""},
		{"empty channel name", strings.Replace(base, "nodes:", "disable_channels: ['']\nnodes:", 1),
			`config: line 3: disable_channels[0]: bad channel name ""`, ""},
		{"long channel name", strings.Replace(base, "nodes:", "disable_channels: [a"+strings.Repeat("b", 32)+"]\nnodes:", 1),
			`config: line 3: disable_channels[0]: bad channel name "abbb`, ""},
		{"duplicate channel", strings.Replace(base, "nodes:", "disable_channels: [ipc, ipc]\nnodes:", 1),
			`config: line 3: disable_channels[1]: duplicate of disable_channels[0] ("ipc")`, ""},
		{"bad node channel", strings.Replace(base, "7002\n", "7002\n    disable_channels: [tcp, ipc/2]\n", 1),
			`config: line 8: nodes[1].disable_channels[1]: bad channel name "ipc/2"`, ""},
		{"heartbeat below minimum", strings.Replace(base, "nodes:", "heartbeat_interval: 1ns\nnodes:", 1),
			`config: line 3: heartbeat_interval: 1ns is below the minimum of 10ms`, ""},
		{"failure timeout of nanoseconds", strings.Replace(base, "nodes:", "heartbeat_interval: 10ms\nfailure_timeout: 3ns\nnodes:", 1),
			`config: line 4: failure_timeout: 3ns must exceed 2 × heartbeat_interval (10ms)`, ""},
		{"dial timeout below minimum", strings.Replace(base, "nodes:", "dial_timeout: 1ns\nnodes:", 1),
			`config: line 3: dial_timeout: 1ns is below the minimum of 10ms`, ""},
		{"transfer timeout below minimum", strings.Replace(base, "nodes:", "flow:\n  transfer_timeout: 1ns\nnodes:", 1),
			`config: line 4: flow.transfer_timeout: 1ns is below the minimum of 100ms`, ""},
		{"reconnect min below minimum", strings.Replace(base, "nodes:", "reconnect_min: 500us\nnodes:", 1),
			`config: line 3: reconnect_min: 500µs is below the minimum of 1ms`, ""},
		{"reconnect max below its minimum", strings.Replace(base, "nodes:", "reconnect_max: 1ns\nnodes:", 1),
			`config: line 3: reconnect_max: 1ns is below reconnect_min (100ms)`, ""},
		{"secret_file_insecure not a bool", strings.Replace(base, "nodes:", "secret_file_insecure: yes\nnodes:", 1),
			`config: line 3: secret_file_insecure: want true or false, got "yes"`, ""},
		{"bad device", strings.Replace(base, "7001\n", "7001\n    devices: [cpu, gpu0]\n", 1),
			`config: line 6: nodes[0].devices[1]: memory: unknown device "gpu0"`, ""},
		{"duplicate device", strings.Replace(base, "7001\n", "7001\n    devices: [cuda:1, cuda:1]\n", 1),
			`config: line 6: nodes[0].devices[1]: duplicate of devices[0] (cuda:1)`, ""},
		{"devices not a list", strings.Replace(base, "7001\n", "7001\n    devices: cuda:0\n", 1),
			`config: line 6: nodes[0].devices: want a list, got "cuda:0"`, ""},
		{"missing address", strings.Replace(base, "    address: 127.0.0.1:7001\n", "", 1),
			`config: line 4: nodes[0].address: required`, ""},
		{"address without port", strings.Replace(base, "127.0.0.1:7001", "127.0.0.1", 1),
			`config: line 5: nodes[0].address: "127.0.0.1": want host:port`, ""},
		{"address with port 0", strings.Replace(base, "127.0.0.1:7001", "127.0.0.1:0", 1),
			`config: line 5: nodes[0].address: "127.0.0.1:0": port must be a number in 1..65535`, ""},
		{"address without host", strings.Replace(base, "127.0.0.1:7001", ":7001", 1),
			`config: line 5: nodes[0].address: ":7001": host is empty`, ""},
		{"no room for data port", strings.Replace(base, "127.0.0.1:7001", "127.0.0.1:65500", 1),
			`config: line 5: nodes[0].address: port 65500 leaves no room for the default data port (+100): set data_address`, ""},
		{"bad node name", strings.Replace(base, "name: b", "name: b/c", 1),
			`config: line 6: nodes[1].name: "b/c": want 1 to 64 characters from [a-zA-Z0-9._-]`, ""},
		{"missing node name", strings.Replace(base, "  - name: b\n    address", "  - address", 1),
			`config: line 6: nodes[1].name: required`, ""},
		{"node not a mapping", base + "  - c\n",
			`config: line 8: nodes[2]: want a mapping of keys, got "c"`, ""},
		{"bad cluster name", strings.Replace(base, "cluster: demo", "cluster: my demo", 1),
			`config: line 1: cluster: "my demo": want 1 to 64 characters`, ""},
		{"long cluster name", strings.Replace(base, "demo", strings.Repeat("x", 65), 1),
			`config: line 1: cluster: "xxxx`, ""},
		{"missing cluster name", strings.Replace(base, "cluster: demo\n", "", 1),
			`config: line 1: cluster: required`, ""},
		{"no nodes", "cluster: demo\nsecret_file: secret.key\n",
			`config: line 1: nodes: at least one node is required`, ""},
		{"empty node list", "cluster: demo\nsecret_file: secret.key\nnodes: []\n",
			`config: line 3: nodes: at least one node is required`, ""},
		{"nodes not a list", "cluster: demo\nsecret_file: secret.key\nnodes: {a: b}\n",
			`config: line 3: nodes: want a list of nodes, got a mapping`, ""},
		{"missing secret", strings.Replace(base, "secret_file: secret.key\n", "", 1),
			`config: line 1: secret_file: a secret is required: set secret_file or secret_env`, ""},
		{"two secrets", strings.Replace(base, "nodes:", "secret_env: TF_TEST_SECRET\nnodes:", 1),
			`config: line 3: secret_env: set only one of secret_file and secret_env`, ""},
		{"short secret", base,
			`config: line 2: secret_file: secret is 15 bytes, want at least 16`, "0123456789abcde\r\n"},
		{"missing secret file", strings.Replace(base, "secret.key", "nope.key", 1),
			`config: line 2: secret_file: open `, ""},
		{"unset secret env", strings.Replace(base, "secret_file: secret.key", "secret_env: TF_TEST_UNSET_SECRET", 1),
			`config: line 2: secret_env: environment variable TF_TEST_UNSET_SECRET is not set`, ""},
		{"root is a list", "- a\n- b\n",
			`config: line 1: want a mapping of keys, got a list`, ""},
		{"yaml syntax", "cluster: demo\nnodes: [a\n",
			`config: yaml: line `, ""},
		{"empty document", "",
			`config: empty document`, ""},
		{"key is a mapping", "? {a: b}\n: c\n",
			`config: line 1: want a plain key, got a mapping`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secret := tt.secret
			if secret == "" {
				secret = testSecret
			}
			c, err := Parse([]byte(tt.yaml), secretDir(t, secret))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not match ErrInvalid", err)
			}
		})
	}
}

func TestParseSecretFileNotExist(t *testing.T) {
	_, err := Parse([]byte(strings.Replace(base, "secret.key", "nope.key", 1)), t.TempDir())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want an error matching fs.ErrNotExist", err)
	}
}

func TestParseSecretEnv(t *testing.T) {
	t.Setenv("TF_TEST_SECRET", testSecret+"\n")
	c, err := Parse([]byte(strings.Replace(base, "secret_file: secret.key", "secret_env: TF_TEST_SECRET", 1)), "")
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Secret) != testSecret {
		t.Errorf("secret %q, want %q", c.Secret, testSecret)
	}
	t.Setenv("TF_TEST_SECRET", "short")
	_, err = Parse([]byte(strings.Replace(base, "secret_file: secret.key", "secret_env: TF_TEST_SECRET", 1)), "")
	if want := "config: line 2: secret_env: secret is 5 bytes, want at least 16"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

func TestParseAbsoluteSecretFile(t *testing.T) {
	path := filepath.Join(secretDir(t, testSecret), "secret.key")
	c, err := Parse([]byte(strings.Replace(base, "secret.key", path, 1)), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Secret) != testSecret {
		t.Errorf("secret %q", c.Secret)
	}
}

// A secret file that group or others may access is refused, as ssh refuses
// such a private key, unless secret_file_insecure says otherwise.
func TestParseSecretFileMode(t *testing.T) {
	for _, tc := range []struct {
		mode     os.FileMode
		insecure bool
		ok       bool
	}{
		{0o600, false, true}, {0o400, false, true},
		{0o644, false, false}, {0o640, false, false}, {0o604, false, false}, {0o620, false, false}, {0o601, false, false},
		{0o644, true, true}, {0o600, true, true},
	} {
		dir := secretDir(t, testSecret)
		path := filepath.Join(dir, "secret.key")
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		yaml := base
		if tc.insecure {
			yaml = strings.Replace(base, "nodes:", "secret_file_insecure: true\nnodes:", 1)
		}
		c, err := Parse([]byte(yaml), dir)
		if tc.ok {
			if err != nil || string(c.Secret) != testSecret || c.SecretFileInsecure != tc.insecure {
				t.Errorf("mode %04o, insecure %v: %v", tc.mode, tc.insecure, err)
			}
			continue
		}
		want := fmt.Sprintf("config: line 2: secret_file: %s is accessible by group or others (mode %04o): chmod 600 it, or set secret_file_insecure: true to accept it", path, tc.mode)
		if err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) {
			t.Errorf("mode %04o: got %v\nwant %s", tc.mode, err, want)
		}
	}
}

func TestParseSecretFileTooLarge(t *testing.T) {
	_, err := Parse([]byte(base), secretDir(t, strings.Repeat("x", maxSecretFile+1)))
	if err == nil || !strings.Contains(err.Error(), "config: line 2: secret_file: ") || !strings.Contains(err.Error(), "is larger than 65536 bytes") {
		t.Fatalf("got %v", err)
	}
}

func TestLoadTestdata(t *testing.T) {
	c, err := Load("testdata/local3.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster != "local3" || len(c.Secret) != 32 || len(c.Nodes) != 3 {
		t.Fatalf("got %+v", c)
	}
	want := []NodeConfig{
		{Name: "a", Address: "127.0.0.1:7001", DataAddress: "127.0.0.1:7101", GossipAddress: "127.0.0.1:7201", Devices: []memory.Device{memory.CUDA(0)}, MetricsAddress: "127.0.0.1:9001"},
		{Name: "b", Address: "127.0.0.1:7002", DataAddress: "127.0.0.1:7202", GossipAddress: "127.0.0.1:7302", Devices: []memory.Device{memory.CUDA(1)}},
		{Name: "c", Address: "127.0.0.1:7003", DataAddress: "127.0.0.1:7103", GossipAddress: "127.0.0.1:7203", Devices: []memory.Device{memory.CPU}, DisableChannels: []string{"verbs"}},
	}
	if !reflect.DeepEqual(c.Nodes, want) {
		t.Errorf("nodes\n%+v\nwant\n%+v", c.Nodes, want)
	}
	d := DefaultConfig()
	d.Staging.Stripes = 2 // the one setting local3.yaml changes
	if c.HeartbeatInterval != d.HeartbeatInterval || c.FailureTimeout != d.FailureTimeout || c.DialTimeout != d.DialTimeout ||
		c.ReconnectMin != d.ReconnectMin || c.ReconnectMax != d.ReconnectMax || c.Transport != d.Transport ||
		c.Flow != d.Flow || c.Staging != d.Staging || c.IPC != d.IPC || c.Verbs != d.Verbs || c.Memory != d.Memory ||
		len(c.DisableChannels) != 0 {
		t.Errorf("testdata/local3.yaml should spell out the defaults, got %+v", c)
	}
	if n, ok := c.Node("b"); !ok || n.Name != "b" {
		t.Errorf("Node(b) = %+v, %v", n, ok)
	}
	if _, ok := c.Node("z"); ok {
		t.Error("Node(z) found")
	}
	if !c.ChannelDisabled("c", "verbs") || c.ChannelDisabled("a", "verbs") {
		t.Error("ChannelDisabled: verbs is disabled on c only")
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "config: read ") {
		t.Fatalf("got %v", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, path := range []string{"testdata/local3.yaml"} {
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		c.DisableChannels = []string{"ipc"}
		c.Staging.ChunkSize = 3000 // not a multiple of KiB
		c.Transport.SharedMemory = false
		c.Transport.ReadSpin = ReadSpinOff
		c.Transport.ReadSpinDetach, c.Transport.BurstDecode, c.Transport.InlineDelivery = SwitchOff, SwitchOn, SwitchOff
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), string(c.Secret)) {
			t.Fatalf("Marshal wrote the secret:\n%s", b)
		}
		back, err := Parse(b, "testdata")
		if err != nil {
			t.Fatalf("%v in\n%s", err, b)
		}
		if got, want := public(back), public(c); !reflect.DeepEqual(got, want) {
			t.Errorf("round trip\ngot  %+v\nwant %+v\nYAML:\n%s", got, want, b)
		}
	}
}

func TestMarshalNeedsSecretSource(t *testing.T) {
	c, err := LocalConfig("t", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Marshal(); err == nil || !strings.HasPrefix(err.Error(), "config: marshal: ") {
		t.Fatalf("got %v, want an error: the config holds only Secret", err)
	}
}

func TestLocalConfigWriteFilesLoad(t *testing.T) {
	c, err := LocalConfig("loop", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Secret) != 32 || c.HeartbeatInterval != 100*time.Millisecond || c.FailureTimeout != 2*time.Second {
		t.Errorf("got %+v", c)
	}
	seen := map[string]bool{}
	for i, n := range c.Nodes {
		if want := "node" + string(rune('0'+i)); n.Name != want {
			t.Errorf("node %d named %q, want %q", i, n.Name, want)
		}
		for _, a := range []string{n.Address, n.DataAddress, n.GossipAddress} {
			if !strings.HasPrefix(a, "127.0.0.1:") || seen[a] {
				t.Errorf("address %q: want a distinct 127.0.0.1 address", a)
			}
			seen[a] = true
		}
	}
	other, err := LocalConfig("loop", 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(other.Secret) == string(c.Secret) {
		t.Error("two LocalConfigs share a secret")
	}

	dir := t.TempDir()
	path, err := c.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.SecretFile != "" {
		t.Errorf("WriteFiles changed the config: SecretFile %q", c.SecretFile)
	}
	fi, err := os.Stat(filepath.Join(dir, SecretFileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file mode %v, want 0600", fi.Mode().Perm())
	}
	back, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := public(c)
	want.SecretFile = SecretFileName
	if got := public(back); !reflect.DeepEqual(got, want) {
		t.Errorf("loaded\n%+v\nwant\n%+v", got, want)
	}
}

func TestLocalConfigBadCount(t *testing.T) {
	for _, n := range []int{0, -1, maxLocalNodes + 1} {
		if _, err := LocalConfig("x", n); err == nil {
			t.Errorf("LocalConfig(%d) succeeded", n)
		}
	}
	if _, err := LocalConfig("bad name", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("LocalConfig with a bad name: %v", err)
	}
}

func TestWriteFilesErrors(t *testing.T) {
	c := DefaultConfig()
	if _, err := c.WriteFiles(t.TempDir()); err == nil {
		t.Error("WriteFiles without a secret succeeded")
	}
	c.Secret = []byte(testSecret + "\n")
	if _, err := c.WriteFiles(t.TempDir()); err == nil {
		t.Error("WriteFiles with a secret ending in a newline succeeded")
	}
	c.Secret = []byte(testSecret)
	if _, err := c.WriteFiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("WriteFiles to a missing directory succeeded")
	}
}

func TestValidateInCode(t *testing.T) {
	c := DefaultConfig()
	c.Cluster = "code"
	c.Secret = []byte(testSecret)
	c.HeartbeatInterval = 0 // filled with the default
	c.Nodes = []NodeConfig{{Name: "a", Address: "localhost:7000"}, {Name: "b"}}
	err := c.Validate()
	if want := "config: nodes[1].address: required"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Line != 0 || ce.Field != "nodes[1].address" {
		t.Errorf("Error %+v", ce)
	}
	c.Nodes[1].Address = "localhost:7001"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.HeartbeatInterval != 500*time.Millisecond || c.Nodes[1].DataAddress != "localhost:7101" || !reflect.DeepEqual(c.Nodes[1].Devices, []memory.Device{memory.CPU}) {
		t.Errorf("defaults not filled: %+v", c)
	}
	before := public(c)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(public(c), before) {
		t.Error("a second Validate changed the config")
	}

	for _, tc := range []struct {
		name   string
		change func(c *Config)
		want   string
	}{
		{"negative timeout", func(c *Config) { c.DialTimeout = -time.Second }, "config: dial_timeout: must be positive, got -1s"},
		{"negative inline", func(c *Config) { c.Transport.InlineThreshold = -1 }, "config: transport.inline_threshold: -1 bytes must be below max_frame_size (16777216)"},
		{"bad device", func(c *Config) { c.Nodes[0].Devices = []memory.Device{{Kind: 9}} }, `config: nodes[0].devices[0]: memory: unknown device "device(9:0)": want cpu, pinned or cuda:N`},
		{"short secret", func(c *Config) { c.Secret = []byte("x") }, "config: secret_file: secret is 1 bytes, want at least 16"},
		{"small frame", func(c *Config) { c.Transport.MaxFrameSize = 100 }, "config: transport.max_frame_size: 100 bytes is outside 1KiB..1GiB"},
		{"tiny heartbeat", func(c *Config) { c.HeartbeatInterval = time.Nanosecond }, "config: heartbeat_interval: 1ns is below the minimum of 10ms"},
		{"tiny transfer timeout", func(c *Config) { c.Flow.TransferTimeout = time.Millisecond }, "config: flow.transfer_timeout: 1ms is below the minimum of 100ms"},
		{"bad channel", func(c *Config) { c.Nodes[0].DisableChannels = []string{"Verbs"} }, `config: nodes[0].disable_channels[0]: bad channel name "Verbs": want a lower-case letter, then up to 31 of [a-z0-9_-]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Cluster = "code"
			c.Secret = []byte(testSecret)
			c.Nodes = []NodeConfig{{Name: "a", Address: "localhost:7000"}}
			tc.change(c)
			if err := c.Validate(); err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %s", err, tc.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0", 0, true}, {"65536", 65536, true}, {"64KiB", 64 << 10, true}, {"16 MiB", 16 << 20, true},
		{"2GiB", 2 << 30, true}, {" 7 ", 7, true},
		{"", 0, false}, {"KiB", 0, false}, {"1.5MiB", 0, false}, {"16MB", 0, false}, {"16mib", 0, false},
		{"-1", 0, false}, {"+1", 0, false}, {"0x10", 0, false}, {"99999999999999999999", 0, false},
		{"9007199254740992GiB", 0, false},
	} {
		got, err := ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if back, err := ParseSize(FormatSize(got)); err != nil || back != got {
				t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", got, back, err)
			}
		}
	}
	for n, want := range map[int]string{0: "0", 1: "1", 1024: "1KiB", 1536: "1536", 3 << 20: "3MiB", 1 << 30: "1GiB", 5<<30 + 1<<20: "5121MiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzParse checks that no input makes Parse panic, and that every config it
// accepts survives Marshal and Parse unchanged.
func FuzzParse(f *testing.F) {
	f.Add([]byte(base))
	f.Add([]byte(everySetting))
	f.Add([]byte(strings.Replace(base, "7002", "7001", 1)))
	f.Add([]byte("cluster: a\nsecret_file: secret.key\ntransport: {max_frame_size: 1GiB, shared_memory: false}\nnodes:\n- {name: x, address: 'h:1', devices: [cuda:1]}\n"))
	if b, err := os.ReadFile("testdata/local3.yaml"); err == nil {
		f.Add(b)
	}
	dir := secretDir(f, testSecret)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, dir)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
			return
		}
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(b, dir)
		if err != nil {
			t.Fatalf("%v in\n%s", err, b)
		}
		if !reflect.DeepEqual(public(back), public(c)) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v", public(back), public(c))
		}
	})
}

// Files the config names are read only if they are regular files of a
// bounded size: a FIFO would block start-up silently, /dev/zero would
// exhaust memory (and stalled FuzzParse's workers, whose inputs name such
// paths).
func TestConfigFilesNotRegular(t *testing.T) {
	dir := secretDir(t, testSecret)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"secret FIFO", strings.Replace(base, "secret.key", fifo, 1), "is not a regular file"},
		{"secret device", strings.Replace(base, "secret.key", "/dev/zero", 1), "is not a regular file"},
		{"CA device", base + "tls:\n  cert_file: " + big + "\n  key_file: " + big + "\n  ca_file: /dev/zero\n", "is larger than"},
		{"CA FIFO", base + "tls:\n  cert_file: " + fifo + "\n  key_file: " + fifo + "\n  ca_file: " + fifo + "\n", "is not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
