package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
)

// GossipConfig tunes the gossip membership (package cluster/gossip, on
// hashicorp/memberlist: SWIM failure detection with suspicion, as Consul and
// Serf run it) (YAML section gossip). The zero value of a field means its
// default, as in DefaultGossipConfig; the timings default to fractions of
// the cluster's failure_timeout, so that a node that stops answering is
// declared down within failure_timeout plus one gossip interval.
//
// How long detection takes: a live member probes the silent node within
// about one ProbeInterval (each member probes one other per interval), the
// probe and its indirect retries fail within the next one, and the node is
// then suspected for SuspicionMult × max(1, log10 N) × ProbeInterval once
// SuspicionMult − 2 other members confirm (up to SuspicionMaxTimeoutMult
// times that without confirmations) before it is declared dead, which
// reaches every member within a few GossipIntervals. With the defaults (a
// ProbeInterval of failure_timeout/12, SuspicionMult 3) that is at most
// failure_timeout for N up to about 2000 nodes.
type GossipConfig struct {
	// ProbeInterval is how often (a duration) each member probes one other
	// member, chosen round robin: the pace of failure detection and most of
	// the idle traffic (one ping and one ack per member per interval,
	// whatever the cluster size). At least MinProbeInterval. Default
	// failure_timeout/12 (250ms with the default failure_timeout of 3s).
	ProbeInterval time.Duration
	// ProbeTimeout is how long (a duration) a probe waits for the direct
	// ack before it asks IndirectChecks other members to probe too; below
	// ProbeInterval, at least 1ms. Default ProbeInterval/2.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a member stays suspected before it is
	// declared dead: SuspicionMult × max(1, log10 N) × ProbeInterval (a
	// count, 1..100). A suspected member that is alive refutes within it.
	// Default 3.
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion timeout when no other
	// member confirms the suspicion: up to this many times the one above
	// (a count, 1..100). Default 4.
	SuspicionMaxTimeoutMult int
	// GossipInterval is how often (a duration) a member sends its queued
	// news (joins, suspicions, deaths) to GossipNodes random members; an
	// idle cluster sends nothing then. At least 1ms. Default
	// failure_timeout/30 (100ms).
	GossipInterval time.Duration
	// GossipNodes is how many random members (a count, 1..64) each gossip
	// round goes to. Default 3.
	GossipNodes int
	// PushPullInterval is how often (a duration) a member exchanges its
	// full state with a random other over TCP, repairing what gossip
	// missed; memberlist stretches it for clusters of more than 32 nodes
	// (× (log2 N − 4)). At least 1s. Default 30s.
	PushPullInterval time.Duration
	// RetransmitMult sets how many times each piece of news is gossiped:
	// RetransmitMult × log10(N+1) (a count, 1..100). Default 4.
	RetransmitMult int
	// TCPTimeout bounds (a duration) one push-pull or join over TCP, and the
	// TCP fallback ping; at least MinDialTimeout. Default 2s.
	TCPTimeout time.Duration
}

// MinProbeInterval bounds GossipConfig.ProbeInterval: a probe more often than
// every 10ms is all a member would do.
const MinProbeInterval = 10 * time.Millisecond

// gossipPortOffset is added to the control port to get the default gossip
// port.
const gossipPortOffset = 200

// DefaultGossipConfig returns the gossip defaults described in GossipConfig
// for a cluster whose failure_timeout is failureTimeout (a value ≤ 0 means
// the default failure_timeout, 3s).
func DefaultGossipConfig(failureTimeout time.Duration) GossipConfig {
	if failureTimeout <= 0 {
		failureTimeout = DefaultConfig().FailureTimeout
	}
	// Twelve probe intervals: two to notice (a probe reaches the node, it
	// fails) and up to ten of suspicion (3 × log10 N for N ≤ 2000).
	probe := max(failureTimeout/12, MinProbeInterval)
	return GossipConfig{
		ProbeInterval: probe,
		// Half the interval leaves the other half for the indirect probes.
		ProbeTimeout: probe / 2,
		// The smallest multiplier that still waits for one confirmation
		// (memberlist waits for SuspicionMult − 2 of them).
		SuspicionMult: 3,
		// Without a confirmation (a partition, a tiny cluster) wait longer.
		SuspicionMaxTimeoutMult: 4,
		// News goes out fast; an idle member sends nothing at this pace.
		GossipInterval: max(failureTimeout/30, time.Millisecond),
		GossipNodes:    3,
		// memberlist's LAN default: state is also repaired by gossip.
		PushPullInterval: 30 * time.Second,
		RetransmitMult:   4,
		TCPTimeout:       2 * time.Second,
	}
}

// WithDefaults returns g with its zero fields set to their defaults for a
// cluster whose failure_timeout is failureTimeout (see DefaultGossipConfig);
// a zero ProbeTimeout is half of the resulting ProbeInterval.
func (g GossipConfig) WithDefaults(failureTimeout time.Duration) GossipConfig {
	d := DefaultGossipConfig(failureTimeout)
	orDur(&g.ProbeInterval, d.ProbeInterval)
	orDur(&g.ProbeTimeout, g.ProbeInterval/2)
	orInt(&g.SuspicionMult, d.SuspicionMult)
	orInt(&g.SuspicionMaxTimeoutMult, d.SuspicionMaxTimeoutMult)
	orDur(&g.GossipInterval, d.GossipInterval)
	orInt(&g.GossipNodes, d.GossipNodes)
	orDur(&g.PushPullInterval, d.PushPullInterval)
	orInt(&g.RetransmitMult, d.RetransmitMult)
	orDur(&g.TCPTimeout, d.TCPTimeout)
	return g
}

// Validate checks g on its own (as validated within a Config), for code
// that builds one without a Config; fields are named as in YAML.
func (g GossipConfig) Validate() error { return g.validate(&Config{}) }

func (g GossipConfig) validate(c *Config) error {
	const p = "gossip."
	if err := c.checkDurations([]durationField{
		{p + "probe_interval", g.ProbeInterval, MinProbeInterval},
		{p + "probe_timeout", g.ProbeTimeout, time.Millisecond},
		{p + "gossip_interval", g.GossipInterval, time.Millisecond},
		{p + "push_pull_interval", g.PushPullInterval, time.Second},
		{p + "tcp_timeout", g.TCPTimeout, MinDialTimeout},
	}); err != nil {
		return err
	}
	if g.ProbeTimeout >= g.ProbeInterval {
		return c.errf(p+"probe_timeout", "%v must be below probe_interval (%v)", g.ProbeTimeout, g.ProbeInterval)
	}
	return c.checkInts([]intField{
		{p + "suspicion_mult", int64(g.SuspicionMult), 1, 100, ""},
		{p + "suspicion_max_timeout_mult", int64(g.SuspicionMaxTimeoutMult), 1, 100, ""},
		{p + "gossip_nodes", int64(g.GossipNodes), 1, 64, ""},
		{p + "retransmit_mult", int64(g.RetransmitMult), 1, 100, ""},
	})
}

// MaxAddressLen bounds the length of an address CheckAddress accepts: a
// DNS name of 253 characters, brackets, a colon and a port.
const MaxAddressLen = 253 + 2 + 1 + 5

// CheckAddress accepts an address as a node's address, data_address or
// gossip_address is written: host:port with a non-empty host of at most
// MaxAddressLen bytes in all, no control characters, and a port in
// 1..65535. For addresses that come from elsewhere than a config file.
func CheckAddress(s string) error {
	if len(s) > MaxAddressLen {
		return fmt.Errorf("address of %d bytes is longer than %d", len(s), MaxAddressLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] == 0x7f {
			return errors.New("address holds a space or control character")
		}
	}
	_, _, err := splitAddr(s)
	return err
}

// defaultGossipAddress returns the gossip address of a node whose control
// address is host:port: the same host, port + gossipPortOffset.
func defaultGossipAddress(host string, port int) (string, error) {
	if port+gossipPortOffset > 65535 {
		return "", fmt.Errorf("port %d leaves no room for the default gossip port (+%d): set gossip_address", port, gossipPortOffset)
	}
	return net.JoinHostPort(host, strconv.Itoa(port+gossipPortOffset)), nil
}

func (c *Config) decodeGossip(v *yaml.Node, field string) error {
	g := &c.Gossip
	return c.section(v, field, map[string]setter{
		"probe_interval":             durationOf(&g.ProbeInterval),
		"probe_timeout":              durationOf(&g.ProbeTimeout),
		"suspicion_mult":             countOf(&g.SuspicionMult),
		"suspicion_max_timeout_mult": countOf(&g.SuspicionMaxTimeoutMult),
		"gossip_interval":            durationOf(&g.GossipInterval),
		"gossip_nodes":               countOf(&g.GossipNodes),
		"push_pull_interval":         durationOf(&g.PushPullInterval),
		"retransmit_mult":            countOf(&g.RetransmitMult),
		"tcp_timeout":                durationOf(&g.TCPTimeout),
	})
}

// fileGossip is the YAML form of GossipConfig written by Marshal.
type fileGossip struct {
	ProbeInterval           string `yaml:"probe_interval,omitempty"`
	ProbeTimeout            string `yaml:"probe_timeout,omitempty"`
	SuspicionMult           int    `yaml:"suspicion_mult,omitempty"`
	SuspicionMaxTimeoutMult int    `yaml:"suspicion_max_timeout_mult,omitempty"`
	GossipInterval          string `yaml:"gossip_interval,omitempty"`
	GossipNodes             int    `yaml:"gossip_nodes,omitempty"`
	PushPullInterval        string `yaml:"push_pull_interval,omitempty"`
	RetransmitMult          int    `yaml:"retransmit_mult,omitempty"`
	TCPTimeout              string `yaml:"tcp_timeout,omitempty"`
}

// file returns g as Marshal writes it, nil when every field is zero.
func (g GossipConfig) file() *fileGossip {
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	return nonZero(&fileGossip{
		ProbeInterval: dur(g.ProbeInterval), ProbeTimeout: dur(g.ProbeTimeout),
		SuspicionMult: g.SuspicionMult, SuspicionMaxTimeoutMult: g.SuspicionMaxTimeoutMult,
		GossipInterval: dur(g.GossipInterval), GossipNodes: g.GossipNodes,
		PushPullInterval: dur(g.PushPullInterval), RetransmitMult: g.RetransmitMult,
		TCPTimeout: dur(g.TCPTimeout),
	})
}
