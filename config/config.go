package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tensorferry/tensorferry/memory"
)

// Config describes a cluster and how its nodes run: the cluster part (its
// name, the shared secret, TLS, liveness timings, the nodes) and one
// section per layer (Transport, Flow, Staging, IPC, Verbs, Memory). Read
// one from a YAML file with Load or Parse, or build one in code starting
// from DefaultConfig or LocalConfig and call Validate.
//
// Every setting has a default (see DefaultConfig and the Default…Config
// constructors of the sections); a zero value in a Config built in code
// takes it at Validate, except the booleans, which keep what they are set
// to (start from DefaultConfig to get their defaults).
//
// A Config is not safe for concurrent modification; once validated it may be
// read from any number of goroutines.
type Config struct {
	// Cluster is the cluster name, 1 to 64 characters from [a-zA-Z0-9._-].
	// Nodes of different clusters refuse each other at handshake. Required.
	Cluster string

	// Secret is the shared secret used for the mutual HMAC handshake, at
	// least MinSecretLen bytes. It is never written by Marshal. When it is
	// empty, Validate loads it from SecretFile or SecretEnv.
	Secret []byte `yaml:"-"`
	// SecretFile is the path of a file holding the secret; one trailing
	// newline ("\n" or "\r\n") is trimmed. A relative path is resolved
	// against the directory of the config file (the dir given to Parse).
	// Like ssh with a private key, Validate refuses a file that its group
	// or others may access (mode & 0o077 != 0) unless SecretFileInsecure.
	SecretFile string
	// SecretFileInsecure (secret_file_insecure: true) accepts a SecretFile
	// that group or others may read: for checked-in test fixtures, whose
	// mode git does not keep, never for a real cluster. Default false.
	SecretFileInsecure bool
	// SecretEnv is the name of an environment variable holding the secret.
	// Exactly one of SecretFile and SecretEnv is set in a config file.
	SecretEnv string

	// HeartbeatInterval is how often (a duration) each node sends a
	// heartbeat on every control connection; at least
	// MinHeartbeatInterval. Default 500ms.
	HeartbeatInterval time.Duration
	// FailureTimeout is how long (a duration) a peer may stay silent before
	// it is declared down. It must exceed 2 × HeartbeatInterval. Default 3s.
	FailureTimeout time.Duration
	// DialTimeout bounds (a duration) one attempt to dial and handshake a
	// peer, TLS included; at least MinDialTimeout. Default 2s.
	DialTimeout time.Duration
	// ReconnectMin is the first backoff delay (a duration) before redialing
	// a lost peer, at least MinReconnectMin; the delay doubles up to
	// ReconnectMax. Default 100ms.
	ReconnectMin time.Duration
	// ReconnectMax is the largest backoff delay (a duration) between
	// redials; at least ReconnectMin. Default 5s.
	ReconnectMax time.Duration

	// DisableChannels lists data channels no node of the cluster may use,
	// such as "ipc" or "verbs". Validate checks only the form of a name (1
	// to 32 characters from [a-z0-9_-], starting with a letter): data
	// channels are an open registry, and the node checks the names against
	// the channels it has. Default none.
	DisableChannels []string

	// TLS, when set, runs every control connection (and, with Data, every
	// data connection) over mutual TLS 1.3; see TLSConfig. Nodes of one
	// cluster must agree on it. Default nil (no TLS).
	TLS *TLSConfig

	// Membership chooses how nodes learn who is alive and when they
	// connect (YAML: membership): MembershipMesh keeps a control connection
	// to every node with heartbeats on each; MembershipGossip runs SWIM
	// gossip (hashicorp/memberlist, section gossip) for liveness and dials
	// control connections on first use, closing them after
	// transport.idle_timeout. Default "" (MembershipAuto): the mesh up to
	// AutoMeshNodes nodes in the node list, gossip above, and gossip with
	// a discovery section. The mesh with a discovery section (membership:
	// mesh set) keeps a connection to every node of the list and every
	// node registered: n-1 connections and heartbeats per node, for a few
	// nodes (Go services with a few PyTorch processes, which cannot
	// gossip). Under gossip, nodes marked NodeConfig.MeshOnly (PyTorch
	// processes), in the list or registered through discovery, are kept by
	// the mesh's rules.
	Membership string

	// Transport tunes the control connections (YAML: transport).
	Transport TransportConfig
	// Flow bounds what tensors in flight may hold (YAML: flow).
	Flow FlowConfig
	// Staging tunes the staging data channel (YAML: staging).
	Staging StagingConfig
	// IPC tunes the same-host CUDA IPC data channel (YAML: ipc).
	IPC IPCConfig
	// Verbs tunes the RDMA verbs data channel (YAML: verbs).
	Verbs VerbsConfig
	// Memory tunes the node's allocators (YAML: memory).
	Memory MemoryConfig
	// Gossip tunes the gossip membership, package cluster/gossip (YAML:
	// gossip); its timings default to fractions of FailureTimeout.
	Gossip GossipConfig
	// Discovery, when set, is where nodes learn the cluster's members
	// besides Nodes (YAML: discovery; package discovery), with either
	// membership. Default nil: Nodes is the whole cluster.
	Discovery *DiscoveryConfig

	// Nodes lists every node of the cluster; there is at least one, unless
	// Discovery is set: then it may be empty or list some nodes only (the
	// others register themselves).
	Nodes []NodeConfig

	// dir is the directory relative secret paths resolve against.
	dir string
	// lines maps field paths ("nodes[1].address") to their YAML line, for
	// error messages; nil for configs built in code.
	lines map[string]int
}

// Membership modes (Config.Membership).
const (
	MembershipAuto   = ""
	MembershipMesh   = "mesh"
	MembershipGossip = "gossip"
)

// AutoMeshNodes is the largest node list for which MembershipAuto runs
// the full mesh (see BENCHMARKS.md, "Scale: membership").
const AutoMeshNodes = 16

// MembershipMode returns the membership the cluster runs: Membership, or
// for MembershipAuto gossip with a discovery section, else the mesh for
// at most AutoMeshNodes nodes and gossip above.
func (c *Config) MembershipMode() string {
	if c.Membership != MembershipAuto {
		return c.Membership
	}
	if c.Discovery != nil {
		return MembershipGossip
	}
	if len(c.Nodes) <= AutoMeshNodes {
		return MembershipMesh
	}
	return MembershipGossip
}

// NodeConfig describes one node of the cluster.
type NodeConfig struct {
	// Name is unique in the cluster, 1 to 64 characters from [a-zA-Z0-9._-].
	Name string
	// Address is the host:port of the node's control listener.
	Address string
	// DataAddress is the host:port of the node's data (bulk) listener.
	// Validate sets it, when empty, to the control port + 100 on the same
	// host.
	DataAddress string
	// GossipAddress is the host:port (UDP and TCP) of the node's gossip
	// membership (package cluster/gossip; YAML: gossip_address). Validate
	// sets it, when empty, to the control port + 200 on the same host;
	// a MeshOnly node has none.
	GossipAddress string
	// MeshOnly marks a node that does not gossip (YAML: mesh_only), such
	// as a Python node (python/tensorferry), which cannot speak the
	// encrypted gossip. When the cluster's membership resolves to gossip,
	// every other node keeps a control connection to it by the mesh's
	// rules (dialed and accepted, heartbeats, failure_timeout, reconnection
	// with backoff, never closed for idleness), and it starts no gossip and
	// keeps one to every node of the list itself. With mesh membership it
	// changes nothing. It must not have a GossipAddress. With a discovery
	// section the node registers the mark, and the gossiping nodes that
	// find it there keep a connection to it the same way. Default false.
	MeshOnly bool
	// Devices lists the devices the node offers; Validate sets [cpu] when
	// empty.
	Devices []memory.Device
	// DisableChannels lists data channels this node must not use, in
	// addition to the cluster-wide Config.DisableChannels.
	DisableChannels []string
	// MetricsAddress is the host:port where the node serves its metrics
	// for Prometheus (YAML: metrics_address; package metrics serves them,
	// `ferry node` and `ferry top` read it). Default "": no metrics
	// listener.
	MetricsAddress string
	// Pprof also serves net/http/pprof on MetricsAddress (YAML: pprof).
	// Default false.
	Pprof bool
}

// MinSecretLen is the smallest accepted secret, in bytes.
const MinSecretLen = 16

// maxSecretFile bounds the size of a secret file read from disk, in bytes.
const maxSecretFile = 64 << 10

// dataPortOffset is added to the control port to get the default data port.
const dataPortOffset = 100

// Lower bounds of the durations, below which a setting cannot work: a
// timer that fires every nanosecond, a dial that cannot finish. Validate
// refuses smaller values.
const (
	// MinHeartbeatInterval bounds HeartbeatInterval: a heartbeat more often
	// than every 10ms is all a node would do.
	MinHeartbeatInterval = 10 * time.Millisecond
	// MinDialTimeout bounds DialTimeout: a TCP connect and a handshake of
	// two round trips take milliseconds even on loopback under load.
	MinDialTimeout = 10 * time.Millisecond
	// MinReconnectMin bounds ReconnectMin: below 1ms a refused dial is
	// retried in a busy loop.
	MinReconnectMin = time.Millisecond
	// MinTransferTimeout bounds FlowConfig.TransferTimeout: a transfer
	// needs at least a rendezvous round trip and a copy.
	MinTransferTimeout = 100 * time.Millisecond
)

// MaxChannelNameLen bounds the length of a data channel name.
const MaxChannelNameLen = 32

// ErrInvalid is matched (with errors.Is) by every error that reports a
// bad configuration; such errors are *Error.
var ErrInvalid = errors.New("config: invalid")

// Error reports what is wrong with a configuration and where.
type Error struct {
	// Line is the 1-based line of the YAML source at fault; 0 for configs
	// built in code.
	Line int
	// Field is the path of the field at fault, such as "nodes[1].address"
	// or "staging.chunk_size"; empty when the whole document is at fault.
	Field string
	// Err says what is wrong; it may wrap an underlying error (a file not
	// found, a bad device).
	Err error
}

// Error returns, for example,
// `config: line 12: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")`.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the cause and ErrInvalid.
func (e *Error) Unwrap() []error { return []error{e.Err, ErrInvalid} }

// DefaultConfig returns a Config for a cluster on a LAN, with every setting
// and section at its default and no cluster name, secret or nodes: fill
// those in, then call Validate. LocalConfig is the one for loopback tests.
func DefaultConfig() *Config {
	return &Config{
		// A heartbeat every 500ms costs nothing on a LAN and lets a
		// failure be noticed within a few seconds.
		HeartbeatInterval: 500 * time.Millisecond,
		// Six missed heartbeats: tolerates a GC pause or a busy link
		// without declaring a live node dead.
		FailureTimeout: 3 * time.Second,
		// A LAN peer answers in well under a millisecond; 2s covers a
		// loaded host without stalling reconnection for long.
		DialTimeout: 2 * time.Second,
		// Redial quickly after a blip, then back off exponentially...
		ReconnectMin: 100 * time.Millisecond,
		// ...but never wait longer than 5s, so a restarted node is found
		// again promptly.
		ReconnectMax: 5 * time.Second,

		Transport: DefaultTransportConfig(),
		Flow:      DefaultFlowConfig(),
		Staging:   DefaultStagingConfig(),
		IPC:       DefaultIPCConfig(),
		Verbs:     DefaultVerbsConfig(),
		Memory:    DefaultMemoryConfig(),
	}
}

// Node returns the node called name.
func (c *Config) Node(name string) (NodeConfig, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return NodeConfig{}, false
}

// ChannelDisabled reports whether node must not use channel, because the
// channel is disabled cluster-wide or for that node.
func (c *Config) ChannelDisabled(node, channel string) bool {
	if slices.Contains(c.DisableChannels, channel) {
		return true
	}
	n, ok := c.Node(node)
	return ok && slices.Contains(n.DisableChannels, channel)
}

// Validate is the one check of a configuration. It fills zero values with
// their defaults (see DefaultConfig and the sections' WithDefaults; a
// node's DataAddress, GossipAddress and Devices too), loads the secret from SecretFile or
// SecretEnv when Secret is empty, and rejects bad values: each against its
// bounds, and across fields (failure_timeout > 2 × heartbeat_interval,
// reconnect_max ≥ reconnect_min, transport.inline_threshold <
// transport.max_frame_size, flow.receive_budget_per_peer ≤
// flow.receive_budget, staging.max_ring_bytes ≥ staging.chunk_size,
// verbs.window ≤ verbs.send_queue, gossip.probe_timeout <
// gossip.probe_interval, distinct node names and addresses, at
// least one node unless Discovery is set,
// pprof only with metrics_address). It reads the TLS files once. Every
// error it returns is an *Error matching ErrInvalid; for configs read from
// YAML it names the line. Validating a valid config again changes nothing.
func (c *Config) Validate() error {
	c.fillDefaults()
	if err := c.validateSettings(); err != nil {
		return err
	}
	if err := c.validateNodes(); err != nil {
		return err
	}
	if c.TLS != nil {
		if err := c.TLS.load(c); err != nil {
			return err
		}
	}
	return c.loadSecret()
}

func (c *Config) fillDefaults() {
	d := DefaultConfig()
	for _, f := range []struct{ v, def *time.Duration }{
		{&c.HeartbeatInterval, &d.HeartbeatInterval},
		{&c.FailureTimeout, &d.FailureTimeout},
		{&c.DialTimeout, &d.DialTimeout},
		{&c.ReconnectMin, &d.ReconnectMin},
		{&c.ReconnectMax, &d.ReconnectMax},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	c.Transport = c.Transport.WithDefaults()
	c.Flow = c.Flow.WithDefaults()
	c.Staging = c.Staging.WithDefaults()
	c.IPC = c.IPC.WithDefaults()
	c.Verbs = c.Verbs.WithDefaults()
	c.Memory = c.Memory.WithDefaults()
	c.Gossip = c.Gossip.WithDefaults(c.FailureTimeout)
	c.Discovery.fillDefaults()
}

// errf returns a *Error for field, with the field's line (or that of
// its nearest recorded parent) when the config came from YAML.
func (c *Config) errf(field, format string, args ...any) error {
	return &Error{Line: c.line(field), Field: field, Err: fmt.Errorf(format, args...)}
}

func (c *Config) line(field string) int {
	for p := field; ; {
		if l, ok := c.lines[p]; ok {
			return l
		}
		if p == "" {
			return 0
		}
		if i := strings.LastIndexAny(p, ".["); i >= 0 {
			p = p[:i]
		} else {
			p = ""
		}
	}
}

func (c *Config) validateSettings() error {
	switch c.Membership {
	case MembershipAuto, MembershipMesh, MembershipGossip:
	default:
		return c.errf("membership", "%q is not a membership: use %q or %q (or leave it out)", c.Membership, MembershipMesh, MembershipGossip)
	}
	if err := checkName(c.Cluster); err != nil {
		return c.errf("cluster", "%w", err)
	}
	if err := c.checkDurations([]durationField{
		{"heartbeat_interval", c.HeartbeatInterval, MinHeartbeatInterval},
		{"failure_timeout", c.FailureTimeout, 0},
		{"dial_timeout", c.DialTimeout, MinDialTimeout},
		{"reconnect_min", c.ReconnectMin, MinReconnectMin},
		{"reconnect_max", c.ReconnectMax, 0},
	}); err != nil {
		return err
	}
	if c.FailureTimeout <= 2*c.HeartbeatInterval {
		return c.errf("failure_timeout", "%v must exceed 2 × heartbeat_interval (%v)", c.FailureTimeout, c.HeartbeatInterval)
	}
	if c.ReconnectMax < c.ReconnectMin {
		return c.errf("reconnect_max", "%v is below reconnect_min (%v)", c.ReconnectMax, c.ReconnectMin)
	}
	for _, check := range []func(*Config) error{
		c.Transport.validate, c.Flow.validate, c.Staging.validate,
		c.IPC.validate, c.Verbs.validate, c.Memory.validate, c.Gossip.validate,
		c.Discovery.validate,
	} {
		if err := check(c); err != nil {
			return err
		}
	}
	return checkChannels(c, "disable_channels", c.DisableChannels)
}

// durationField is a duration to check: positive, and at least min.
type durationField struct {
	name string
	v    time.Duration
	min  time.Duration // 0: bounded by another field, checked apart
}

func (c *Config) checkDurations(fs []durationField) error {
	for _, f := range fs {
		if f.v < 0 {
			return c.errf(f.name, "must be positive, got %v", f.v)
		}
		if f.v < f.min {
			return c.errf(f.name, "%v is below the minimum of %v", f.v, f.min)
		}
	}
	return nil
}

// intField is a count or size to check against [min, max].
type intField struct {
	name     string
	v        int64
	min, max int64
	unit     string // "bytes" for sizes, "" for counts
}

func (c *Config) checkInts(fs []intField) error {
	for _, f := range fs {
		if f.v >= f.min && f.v <= f.max {
			continue
		}
		if f.unit == "bytes" {
			return c.errf(f.name, "%d bytes is outside %s..%s", f.v, FormatSize(int(f.min)), FormatSize(int(f.max)))
		}
		return c.errf(f.name, "%d is outside %d..%d", f.v, f.min, f.max)
	}
	return nil
}

func checkChannels(c *Config, field string, chans []string) error {
	for i, ch := range chans {
		if err := CheckChannelName(ch); err != nil {
			return c.errf(fmt.Sprintf("%s[%d]", field, i), "%w", err)
		}
		if j := slices.Index(chans[:i], ch); j >= 0 {
			return c.errf(fmt.Sprintf("%s[%d]", field, i), "duplicate of %s[%d] (%q)", field, j, ch)
		}
	}
	return nil
}

// CheckChannelName accepts a data channel name: a lower-case letter, then
// up to 31 characters from [a-z0-9_-].
func CheckChannelName(s string) error {
	ok := len(s) >= 1 && len(s) <= MaxChannelNameLen && s[0] >= 'a' && s[0] <= 'z'
	for i := 1; ok && i < len(s); i++ {
		b := s[i]
		ok = b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '_' || b == '-'
	}
	if !ok {
		return fmt.Errorf("bad channel name %q: want a lower-case letter, then up to %d of [a-z0-9_-]", s, MaxChannelNameLen-1)
	}
	return nil
}

// checkName accepts 1 to 64 characters from [a-zA-Z0-9._-].
func checkName(s string) error {
	if s == "" {
		return errors.New("required")
	}
	if len(s) > 64 {
		return fmt.Errorf("%q is longer than 64 characters", s)
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return fmt.Errorf("%q: want 1 to 64 characters from [a-zA-Z0-9._-]", s)
		}
	}
	return nil
}

// loadSecret reads the secret from SecretFile or SecretEnv unless Secret is
// already set, and checks its length.
func (c *Config) loadSecret() error {
	if c.SecretFile != "" && c.SecretEnv != "" {
		return c.errf("secret_env", "set only one of secret_file and secret_env")
	}
	if len(c.Secret) == 0 {
		switch {
		case c.SecretFile != "":
			b, err := readSecretFile(c.secretPath(), c.SecretFileInsecure)
			if err != nil {
				return c.errf("secret_file", "%w", err)
			}
			c.Secret = trimNewline(b)
		case c.SecretEnv != "":
			v, ok := os.LookupEnv(c.SecretEnv)
			if !ok {
				return c.errf("secret_env", "environment variable %s is not set", c.SecretEnv)
			}
			c.Secret = trimNewline([]byte(v))
		default:
			return c.errf("secret_file", "a secret is required: set secret_file or secret_env")
		}
	}
	if len(c.Secret) < MinSecretLen {
		field := "secret_file"
		if c.SecretEnv != "" {
			field = "secret_env"
		}
		return c.errf(field, "secret is %d bytes, want at least %d", len(c.Secret), MinSecretLen)
	}
	return nil
}

// secretPath resolves SecretFile against the config file's directory.
func (c *Config) secretPath() string { return c.resolvePath(c.SecretFile) }

// readSecretFile reads the secret file at path, refusing one that group or
// others may access unless insecure.
func readSecretFile(path string, insecure bool) ([]byte, error) {
	return readFile(path, maxSecretFile, func(fi os.FileInfo) error {
		// Windows has no such mode bits: Go reports 0666 for every file.
		if perm := fi.Mode().Perm(); perm&0o077 != 0 && !insecure && runtime.GOOS != "windows" {
			return fmt.Errorf("%s is accessible by group or others (mode %04o): chmod 600 it, or set secret_file_insecure: true to accept it", path, perm)
		}
		return nil
	})
}

// readFile reads a file the config names (secret, certificates, keys): a
// regular file of at most max bytes. It never blocks on a FIFO nor reads
// a device without end (/dev/zero): it opens without blocking and refuses
// anything but a regular file. check, if not nil, vets the file first.
func readFile(path string, max int64, check func(os.FileInfo) error) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if check != nil {
		if err := check(fi); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

func (c *Config) validateNodes() error {
	if len(c.Nodes) == 0 && c.Discovery == nil {
		return c.errf("nodes", "at least one node is required (or a discovery section)")
	}
	names := make(map[string]int, len(c.Nodes))
	type owner struct {
		node  int
		field string
	}
	addrs := make(map[string]owner, 2*len(c.Nodes))
	for i := range c.Nodes {
		n := &c.Nodes[i]
		p := fmt.Sprintf("nodes[%d]", i)
		if err := checkName(n.Name); err != nil {
			return c.errf(p+".name", "%w", err)
		}
		if j, dup := names[n.Name]; dup {
			return c.errf(p+".name", "duplicate of nodes[%d] (%q)", j, n.Name)
		}
		names[n.Name] = i
		if n.Address == "" {
			return c.errf(p+".address", "required")
		}
		host, port, err := splitAddr(n.Address)
		if err != nil {
			return c.errf(p+".address", "%w", err)
		}
		n.Address = net.JoinHostPort(host, strconv.Itoa(port))
		if n.DataAddress == "" {
			if port+dataPortOffset > 65535 {
				return c.errf(p+".address", "port %d leaves no room for the default data port (+%d): set data_address", port, dataPortOffset)
			}
			n.DataAddress = net.JoinHostPort(host, strconv.Itoa(port+dataPortOffset))
		} else {
			dh, dp, err := splitAddr(n.DataAddress)
			if err != nil {
				return c.errf(p+".data_address", "%w", err)
			}
			n.DataAddress = net.JoinHostPort(dh, strconv.Itoa(dp))
		}
		gossipDefault := n.GossipAddress == "" && !n.MeshOnly
		switch {
		case n.MeshOnly && n.GossipAddress != "":
			return c.errf(p+".gossip_address", "set on a mesh_only node, which does not gossip: leave it out")
		case n.MeshOnly:
		case gossipDefault:
			if n.GossipAddress, err = defaultGossipAddress(host, port); err != nil {
				return c.errf(p+".address", "%w", err)
			}
		default:
			gh, gp, err := splitAddr(n.GossipAddress)
			if err != nil {
				return c.errf(p+".gossip_address", "%w", err)
			}
			n.GossipAddress = net.JoinHostPort(gh, strconv.Itoa(gp))
		}
		for _, a := range []struct{ field, addr string }{{"address", n.Address}, {"data_address", n.DataAddress}, {"gossip_address", n.GossipAddress}} {
			if a.addr == "" {
				continue // a mesh_only node's gossip_address
			}
			if o, dup := addrs[a.addr]; dup {
				of := fmt.Sprintf("nodes[%d]", o.node)
				if o.field != a.field {
					of += "." + o.field
				}
				hint := ""
				if a.field == "gossip_address" && gossipDefault {
					hint = fmt.Sprintf(" (the default, control port + %d): set gossip_address", gossipPortOffset)
				}
				return c.errf(p+"."+a.field, "duplicate of %s (%q)%s", of, a.addr, hint)
			}
			addrs[a.addr] = owner{i, a.field}
		}
		if n.MetricsAddress != "" {
			mh, mp, err := net.SplitHostPort(n.MetricsAddress)
			if pn, perr := strconv.Atoi(mp); err != nil || perr != nil || pn < 1 || pn > 65535 {
				return c.errf(p+".metrics_address", "%q: want host:port (or :port for every interface) with a port in 1..65535", n.MetricsAddress)
			}
			if mh != "" {
				a := net.JoinHostPort(mh, mp)
				if o, dup := addrs[a]; dup {
					return c.errf(p+".metrics_address", "duplicate of nodes[%d].%s (%q)", o.node, o.field, a)
				}
				addrs[a] = owner{i, "metrics_address"}
			}
		}
		if n.Pprof && n.MetricsAddress == "" {
			return c.errf(p+".pprof", "pprof is served on metrics_address: set it too")
		}
		if len(n.Devices) == 0 {
			n.Devices = []memory.Device{memory.CPU}
		}
		for k, d := range n.Devices {
			if _, err := memory.ParseDevice(d.String()); err != nil {
				return c.errf(fmt.Sprintf("%s.devices[%d]", p, k), "%w", err)
			}
			if j := slices.Index(n.Devices[:k], d); j >= 0 {
				return c.errf(fmt.Sprintf("%s.devices[%d]", p, k), "duplicate of devices[%d] (%s)", j, d)
			}
		}
		if err := checkChannels(c, p+".disable_channels", n.DisableChannels); err != nil {
			return err
		}
	}
	return nil
}

// splitAddr parses host:port with a non-empty host and a port in 1..65535.
func splitAddr(s string) (string, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%q: want host:port: %w", s, err)
	}
	if host == "" {
		return "", 0, fmt.Errorf("%q: host is empty", s)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be a number in 1..65535", s)
	}
	return host, port, nil
}
