package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tensorferry/tensorferry/memory"
)

// DiscoveryConfig says where a node learns the cluster's members from
// besides the config's node list (YAML section discovery). Nil (the
// default) keeps the node list of the file as the whole cluster. Package
// discovery reads it.
type DiscoveryConfig struct {
	// Etcd registers every node in an etcd cluster and learns the others
	// from it (YAML: etcd). Required in the section.
	Etcd *EtcdConfig
}

// EtcdConfig is discovery through etcd (YAML section discovery.etcd): a
// node registers its name, addresses and devices under a lease and
// watches the others' entries. The zero value of a field means its
// default, as in DefaultEtcdConfig.
type EtcdConfig struct {
	// Endpoints are the URLs of etcd's client port (http://host:2379 or
	// https://…), tried in turn. At least one; no default.
	Endpoints []string
	// Prefix starts every key the cluster writes: a node registers under
	// {prefix}{cluster}/nodes/{name}. 1 to MaxEtcdPrefixLen printable
	// ASCII characters without spaces. Default "/tensorferry/".
	Prefix string
	// LeaseTTL is the lifetime (a duration, whole seconds: etcd counts
	// leases in seconds) of a node's registration; it is kept alive every
	// third of it, and a node that stops doing so is reported gone after
	// about this long. MinEtcdLeaseTTL..MaxEtcdLeaseTTL. Default 10s.
	LeaseTTL time.Duration
	// DialTimeout bounds (a duration) connecting to an endpoint and each
	// request to etcd but the streaming watch; at least MinDialTimeout.
	// Default 2s.
	DialTimeout time.Duration
}

// Bounds of EtcdConfig.
const (
	// MinEtcdLeaseTTL is the shortest lease: etcd refuses shorter ones
	// (its minimum is 1.5 election timeouts, 1.5s by default, rounded up).
	MinEtcdLeaseTTL = 2 * time.Second
	// MaxEtcdLeaseTTL is the longest lease: beyond an hour a node that
	// died would stay listed far too long.
	MaxEtcdLeaseTTL = time.Hour
	// MaxEtcdPrefixLen bounds the length of EtcdConfig.Prefix in bytes.
	MaxEtcdPrefixLen = 256
)

// DefaultEtcdConfig returns the defaults described in EtcdConfig, with no
// endpoints.
func DefaultEtcdConfig() EtcdConfig {
	return EtcdConfig{
		// Apart from anything else an operator keeps under etcd.
		Prefix: "/tensorferry/",
		// A node gone without a word is noticed within 10s, while a
		// keepalive every 3.3s costs etcd nothing even for thousands of
		// nodes.
		LeaseTTL: 10 * time.Second,
		// etcd answers in milliseconds on a LAN; 2s covers a loaded one.
		DialTimeout: 2 * time.Second,
	}
}

// WithDefaults returns e with its zero fields set to their defaults.
func (e EtcdConfig) WithDefaults() EtcdConfig {
	d := DefaultEtcdConfig()
	if e.Prefix == "" {
		e.Prefix = d.Prefix
	}
	orDur(&e.LeaseTTL, d.LeaseTTL)
	orDur(&e.DialTimeout, d.DialTimeout)
	return e
}

// fillDefaults fills the zero values of the section, if any.
func (d *DiscoveryConfig) fillDefaults() {
	if d != nil && d.Etcd != nil {
		*d.Etcd = d.Etcd.WithDefaults()
	}
}

func (d *DiscoveryConfig) validate(c *Config) error {
	if d == nil {
		return nil
	}
	if d.Etcd == nil {
		return c.errf("discovery", "name a source: etcd")
	}
	const p = "discovery.etcd."
	e := d.Etcd
	if len(e.Endpoints) == 0 {
		return c.errf(p+"endpoints", "at least one endpoint is required (http://host:2379)")
	}
	for i, ep := range e.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			return c.errf(fmt.Sprintf("%sendpoints[%d]", p, i), "%w", err)
		}
		if j := slices.Index(e.Endpoints[:i], ep); j >= 0 {
			return c.errf(fmt.Sprintf("%sendpoints[%d]", p, i), "duplicate of endpoints[%d] (%q)", j, ep)
		}
	}
	if len(e.Prefix) > MaxEtcdPrefixLen {
		return c.errf(p+"prefix", "%d bytes is longer than %d", len(e.Prefix), MaxEtcdPrefixLen)
	}
	for _, b := range []byte(e.Prefix) {
		if b <= ' ' || b > '~' {
			return c.errf(p+"prefix", "%q: want printable ASCII without spaces", e.Prefix)
		}
	}
	if e.LeaseTTL < MinEtcdLeaseTTL || e.LeaseTTL > MaxEtcdLeaseTTL {
		return c.errf(p+"lease_ttl", "%v is outside %v..%v", e.LeaseTTL, MinEtcdLeaseTTL, MaxEtcdLeaseTTL)
	}
	if e.LeaseTTL%time.Second != 0 {
		return c.errf(p+"lease_ttl", "%v: want whole seconds (etcd counts leases in seconds)", e.LeaseTTL)
	}
	return c.checkDurations([]durationField{{p + "dial_timeout", e.DialTimeout, MinDialTimeout}})
}

// checkEndpoint accepts http:// or https:// with a host and port and no
// path, query or credentials.
func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want http://host:port or https://host:port", s)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want only scheme, host and port", s)
	}
	if _, _, err := splitAddr(u.Host); err != nil {
		return err
	}
	return nil
}

// CheckName accepts a cluster or node name: 1 to 64 characters from
// [a-zA-Z0-9._-].
func CheckName(s string) error { return checkName(s) }

// CheckNode checks a node's public part as another process announced it
// (through discovery): its name, address, data address and devices, the
// way Validate checks the nodes of a file, and completes it the same way
// (DataAddress, when empty, is the control port + 100; GossipAddress, the
// control port + 200 unless the node is MeshOnly, which has none; Devices,
// when empty, [cpu]; addresses are written host:port). The settings that only
// the node itself reads (DisableChannels, MetricsAddress, Pprof) must be
// unset. Errors are plain errors naming the field.
func CheckNode(n *NodeConfig) error {
	if err := checkName(n.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	host, port, err := splitAddr(n.Address)
	if err != nil {
		return fmt.Errorf("address: %w", err)
	}
	n.Address = net.JoinHostPort(host, strconv.Itoa(port))
	if n.DataAddress == "" {
		if port+dataPortOffset > 65535 {
			return fmt.Errorf("address: port %d leaves no room for the default data port (+%d)", port, dataPortOffset)
		}
		n.DataAddress = net.JoinHostPort(host, strconv.Itoa(port+dataPortOffset))
	} else {
		dh, dp, err := splitAddr(n.DataAddress)
		if err != nil {
			return fmt.Errorf("data_address: %w", err)
		}
		n.DataAddress = net.JoinHostPort(dh, strconv.Itoa(dp))
	}
	if n.DataAddress == n.Address {
		return fmt.Errorf("data_address: same as address (%q)", n.Address)
	}
	switch {
	case n.MeshOnly && n.GossipAddress != "":
		return fmt.Errorf("gossip_address: set on a mesh_only node, which does not gossip")
	case n.MeshOnly:
	case n.GossipAddress == "":
		if n.GossipAddress, err = defaultGossipAddress(host, port); err != nil {
			return fmt.Errorf("address: %w", err)
		}
	default:
		gh, gp, err := splitAddr(n.GossipAddress)
		if err != nil {
			return fmt.Errorf("gossip_address: %w", err)
		}
		n.GossipAddress = net.JoinHostPort(gh, strconv.Itoa(gp))
	}
	if n.GossipAddress != "" && (n.GossipAddress == n.Address || n.GossipAddress == n.DataAddress) {
		return fmt.Errorf("gossip_address: same as address or data_address (%q)", n.GossipAddress)
	}
	if len(n.DisableChannels) > 0 || n.MetricsAddress != "" || n.Pprof {
		return fmt.Errorf("disable_channels, metrics_address and pprof are the node's own settings, not announced")
	}
	if len(n.Devices) == 0 {
		n.Devices = []memory.Device{memory.CPU}
	}
	if len(n.Devices) > MaxNodeDevices {
		return fmt.Errorf("devices: %d devices, at most %d", len(n.Devices), MaxNodeDevices)
	}
	for k, d := range n.Devices {
		if _, err := memory.ParseDevice(d.String()); err != nil {
			return fmt.Errorf("devices[%d]: %w", k, err)
		}
		if j := slices.Index(n.Devices[:k], d); j >= 0 {
			return fmt.Errorf("devices[%d]: duplicate of devices[%d] (%s)", k, j, d)
		}
	}
	return nil
}

// MaxNodeDevices bounds the devices of a node announced through discovery.
const MaxNodeDevices = 256

func (c *Config) decodeDiscovery(v *yaml.Node, field string) error {
	d := &DiscoveryConfig{}
	c.Discovery = d
	return c.pairs(v, field+".", func(k *yaml.Node, field string, v *yaml.Node) error {
		if k.Value != "etcd" {
			return at(k, field, "unknown key (the sources are: etcd)")
		}
		e := &EtcdConfig{}
		d.Etcd = e
		return c.section(v, field, map[string]setter{
			"endpoints": func(v *yaml.Node, field string) (err error) {
				e.Endpoints, err = stringList(v, field)
				for i := range e.Endpoints {
					c.lines[fmt.Sprintf("%s[%d]", field, i)] = resolve(v.Content[i]).Line
				}
				return err
			},
			"prefix":       stringOf(&e.Prefix),
			"lease_ttl":    durationOf(&e.LeaseTTL),
			"dial_timeout": durationOf(&e.DialTimeout),
		})
	})
}

// fileDiscovery is the YAML form of DiscoveryConfig written by Marshal.
type fileDiscovery struct {
	Etcd *fileEtcd `yaml:"etcd,omitempty"`
}

type fileEtcd struct {
	Endpoints   []string `yaml:"endpoints,flow"`
	Prefix      string   `yaml:"prefix,omitempty"`
	LeaseTTL    string   `yaml:"lease_ttl,omitempty"`
	DialTimeout string   `yaml:"dial_timeout,omitempty"`
}

// file returns the YAML form of d, nil when d is.
func (d *DiscoveryConfig) file() *fileDiscovery {
	if d == nil {
		return nil
	}
	f := &fileDiscovery{}
	if e := d.Etcd; e != nil {
		f.Etcd = &fileEtcd{Endpoints: e.Endpoints, Prefix: e.Prefix}
		if e.LeaseTTL != 0 {
			f.Etcd.LeaseTTL = e.LeaseTTL.String()
		}
		if e.DialTimeout != 0 {
			f.Etcd.DialTimeout = e.DialTimeout.String()
		}
	}
	return f
}
