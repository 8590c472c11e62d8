package cluster

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tensorferry/tensorferry/memory"
)

// Load reads the YAML config file at path, loads the secret (a relative
// secret_file resolves against the file's directory) and validates it.
// Errors about the file's content are *ConfigError naming the line.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: read config: %w", err)
	}
	c, err := Parse(data, filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Parse decodes a YAML config, loads the secret (a relative secret_file
// resolves against dir) and validates it. Unknown keys, duplicate keys, bad
// durations or sizes and every error of Validate are reported as a
// *ConfigError naming the field and the line.
func Parse(data []byte, dir string) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ConfigError{Err: err}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, &ConfigError{Err: errors.New("empty document")}
	}
	c := &Config{dir: dir, lines: make(map[string]int)}
	if err := c.decode(doc.Content[0]); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// at returns a *ConfigError at node n.
func at(n *yaml.Node, field, format string, args ...any) error {
	return &ConfigError{Line: n.Line, Field: field, Err: fmt.Errorf(format, args...)}
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// pairs calls f for each key of the mapping n, rejecting non-mappings,
// non-scalar keys and duplicate keys. A null value is skipped: it leaves the
// field unset.
func (c *Config) pairs(n *yaml.Node, prefix string, f func(key *yaml.Node, field string, v *yaml.Node) error) error {
	n = resolve(n)
	name := strings.TrimSuffix(prefix, ".")
	if n.Kind != yaml.MappingNode {
		return at(n, name, "want a mapping of keys, got %s", kindName(n))
	}
	if name != "" {
		c.lines[name] = n.Line
	} else {
		c.lines[""] = n.Line
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return at(k, name, "want a plain key, got %s", kindName(k))
		}
		field := prefix + k.Value
		if seen[k.Value] {
			return at(k, field, "duplicate key")
		}
		seen[k.Value] = true
		c.lines[field] = v.Line
		if isNull(v) {
			continue
		}
		if err := f(k, field, v); err != nil {
			return err
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}

func scalar(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode {
		return "", at(v, field, "want a single value, got %s", kindName(v))
	}
	return v.Value, nil
}

func stringList(v *yaml.Node, field string) ([]string, error) {
	if v.Kind != yaml.SequenceNode {
		return nil, at(v, field, "want a list, got %s", kindName(v))
	}
	if len(v.Content) == 0 {
		return nil, nil // an empty list is the same as none
	}
	out := make([]string, 0, len(v.Content))
	for i, e := range v.Content {
		e = resolve(e)
		s, err := scalar(e, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func (c *Config) decode(root *yaml.Node) error {
	return c.pairs(root, "", func(k *yaml.Node, field string, v *yaml.Node) error {
		var err error
		switch k.Value {
		case "cluster":
			c.Cluster, err = scalar(v, field)
		case "secret_file":
			c.SecretFile, err = scalar(v, field)
		case "secret_env":
			c.SecretEnv, err = scalar(v, field)
		case "secret_file_insecure":
			c.SecretFileInsecure, err = boolean(v, field)
		case "heartbeat_interval":
			c.HeartbeatInterval, err = duration(v, field)
		case "failure_timeout":
			c.FailureTimeout, err = duration(v, field)
		case "dial_timeout":
			c.DialTimeout, err = duration(v, field)
		case "reconnect_min":
			c.ReconnectMin, err = duration(v, field)
		case "reconnect_max":
			c.ReconnectMax, err = duration(v, field)
		case "transfer_timeout":
			c.TransferTimeout, err = duration(v, field)
		case "max_frame_size":
			c.MaxFrameSize, err = size(v, field)
		case "inline_threshold":
			c.InlineThreshold, err = size(v, field)
		case "receive_budget":
			c.ReceiveBudget, err = size(v, field)
		case "receive_budget_per_peer":
			c.ReceiveBudgetPerPeer, err = size(v, field)
		case "receive_window":
			c.ReceiveWindow, err = count(v, field)
		case "inbox_messages":
			c.InboxMessages, err = count(v, field)
		case "chunk_size":
			c.ChunkSize, err = size(v, field)
		case "chunks_in_flight":
			c.ChunksInFlight, err = count(v, field)
		case "disable_channels":
			c.DisableChannels, err = c.channels(v, field)
		case "nodes":
			err = c.decodeNodes(v, field)
		case "tls":
			err = c.decodeTLS(v, field)
		default:
			err = at(k, field, "unknown key")
		}
		return err
	})
}

func (c *Config) decodeTLS(v *yaml.Node, field string) error {
	t := &TLSConfig{}
	c.TLS = t
	return c.pairs(v, field+".", func(k *yaml.Node, field string, v *yaml.Node) error {
		var err error
		switch k.Value {
		case "cert_file":
			t.CertFile, err = scalar(v, field)
		case "key_file":
			t.KeyFile, err = scalar(v, field)
		case "ca_file":
			t.CAFile, err = scalar(v, field)
		case "data":
			t.Data, err = boolean(v, field)
		default:
			err = at(k, field, "unknown key")
		}
		return err
	})
}

func (c *Config) channels(v *yaml.Node, field string) ([]string, error) {
	s, err := stringList(v, field)
	if err != nil {
		return nil, err
	}
	for i := range s {
		c.lines[fmt.Sprintf("%s[%d]", field, i)] = resolve(v.Content[i]).Line
	}
	return s, nil
}

func (c *Config) decodeNodes(v *yaml.Node, field string) error {
	if v.Kind != yaml.SequenceNode {
		return at(v, field, "want a list of nodes, got %s", kindName(v))
	}
	c.Nodes = make([]NodeConfig, 0, len(v.Content))
	for i, e := range v.Content {
		var n NodeConfig
		prefix := fmt.Sprintf("%s[%d].", field, i)
		err := c.pairs(e, prefix, func(k *yaml.Node, field string, v *yaml.Node) error {
			var err error
			switch k.Value {
			case "name":
				n.Name, err = scalar(v, field)
			case "address":
				n.Address, err = scalar(v, field)
			case "data_address":
				n.DataAddress, err = scalar(v, field)
			case "devices":
				n.Devices, err = c.devices(v, field)
			case "disable_channels":
				n.DisableChannels, err = c.channels(v, field)
			default:
				err = at(k, field, "unknown key")
			}
			return err
		})
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
	}
	return nil
}

func (c *Config) devices(v *yaml.Node, field string) ([]memory.Device, error) {
	s, err := stringList(v, field)
	if err != nil {
		return nil, err
	}
	out := make([]memory.Device, 0, len(s))
	for i, name := range s {
		d, err := memory.ParseDevice(name)
		if err != nil {
			return nil, &ConfigError{Line: resolve(v.Content[i]).Line, Field: fmt.Sprintf("%s[%d]", field, i), Err: err}
		}
		c.lines[fmt.Sprintf("%s[%d]", field, i)] = resolve(v.Content[i]).Line
		out = append(out, d)
	}
	return out, nil
}

func boolean(v *yaml.Node, field string) (bool, error) {
	s, err := scalar(v, field)
	if err != nil {
		return false, err
	}
	switch s {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, at(v, field, "want true or false, got %q", s)
}

func duration(v *yaml.Node, field string) (time.Duration, error) {
	s, err := scalar(v, field)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, at(v, field, "bad duration %q: want a Go duration such as 500ms or 3s", s)
	}
	if d <= 0 {
		return 0, at(v, field, "must be positive, got %q", s)
	}
	return d, nil
}

func size(v *yaml.Node, field string) (int, error) {
	s, err := scalar(v, field)
	if err != nil {
		return 0, err
	}
	n, err := ParseSize(s)
	if err != nil {
		return 0, &ConfigError{Line: v.Line, Field: field, Err: err}
	}
	if n == 0 {
		return 0, at(v, field, "must be positive, got %q", s)
	}
	return n, nil
}

func count(v *yaml.Node, field string) (int, error) {
	s, err := scalar(v, field)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, at(v, field, "bad count %q: want a positive integer", s)
	}
	return n, nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// ParseSize parses a byte count: a plain non-negative integer ("65536") or
// one with a KiB, MiB or GiB suffix ("64KiB", "16 MiB").
func ParseSize(s string) (int, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || num[0] == '+' {
		return 0, fmt.Errorf("bad size %q: want bytes as an integer or with a KiB, MiB or GiB suffix", s)
	}
	if n > math.MaxInt/mult || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int(n * mult), nil
}

// FormatSize writes n bytes as ParseSize reads them, with the largest of the
// GiB, MiB and KiB suffixes that divides n exactly.
func FormatSize(n int) string {
	for _, u := range sizeUnits {
		if n != 0 && int64(n)%u.mult == 0 {
			return strconv.FormatInt(int64(n)/u.mult, 10) + u.suffix
		}
	}
	return strconv.Itoa(n)
}

// fileConfig is the YAML form written by Marshal.
type fileConfig struct {
	Cluster           string     `yaml:"cluster"`
	SecretFile        string     `yaml:"secret_file,omitempty"`
	SecretEnv         string     `yaml:"secret_env,omitempty"`
	SecretInsecure    bool       `yaml:"secret_file_insecure,omitempty"`
	HeartbeatInterval string     `yaml:"heartbeat_interval,omitempty"`
	FailureTimeout    string     `yaml:"failure_timeout,omitempty"`
	DialTimeout       string     `yaml:"dial_timeout,omitempty"`
	ReconnectMin      string     `yaml:"reconnect_min,omitempty"`
	ReconnectMax      string     `yaml:"reconnect_max,omitempty"`
	MaxFrameSize      string     `yaml:"max_frame_size,omitempty"`
	InlineThreshold   string     `yaml:"inline_threshold,omitempty"`
	ReceiveBudget     string     `yaml:"receive_budget,omitempty"`
	ReceivePerPeer    string     `yaml:"receive_budget_per_peer,omitempty"`
	ReceiveWindow     int        `yaml:"receive_window,omitempty"`
	InboxMessages     int        `yaml:"inbox_messages,omitempty"`
	ChunkSize         string     `yaml:"chunk_size,omitempty"`
	ChunksInFlight    int        `yaml:"chunks_in_flight,omitempty"`
	TransferTimeout   string     `yaml:"transfer_timeout,omitempty"`
	DisableChannels   []string   `yaml:"disable_channels,omitempty,flow"`
	TLS               *fileTLS   `yaml:"tls,omitempty"`
	Nodes             []fileNode `yaml:"nodes"`
}

type fileTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	Data     bool   `yaml:"data,omitempty"`
}

type fileNode struct {
	Name            string   `yaml:"name"`
	Address         string   `yaml:"address"`
	DataAddress     string   `yaml:"data_address,omitempty"`
	Devices         []string `yaml:"devices,omitempty,flow"`
	DisableChannels []string `yaml:"disable_channels,omitempty,flow"`
}

// Marshal writes c as YAML that Parse reads back. The secret itself is never
// written, only SecretFile or SecretEnv, so one of them must be set (see
// WriteFiles for configs that hold only Secret). Zero settings are left out
// and take their defaults when read back.
func (c *Config) Marshal() ([]byte, error) {
	if c.SecretFile == "" && c.SecretEnv == "" {
		return nil, errors.New("cluster: marshal: set SecretFile or SecretEnv (the secret itself is never written; WriteFiles writes it to a file)")
	}
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	sz := func(n int) string {
		if n == 0 {
			return ""
		}
		return FormatSize(n)
	}
	f := fileConfig{
		Cluster:           c.Cluster,
		SecretFile:        c.SecretFile,
		SecretEnv:         c.SecretEnv,
		SecretInsecure:    c.SecretFileInsecure,
		HeartbeatInterval: dur(c.HeartbeatInterval),
		FailureTimeout:    dur(c.FailureTimeout),
		DialTimeout:       dur(c.DialTimeout),
		ReconnectMin:      dur(c.ReconnectMin),
		ReconnectMax:      dur(c.ReconnectMax),
		TransferTimeout:   dur(c.TransferTimeout),
		MaxFrameSize:      sz(c.MaxFrameSize),
		InlineThreshold:   sz(c.InlineThreshold),
		ReceiveBudget:     sz(c.ReceiveBudget),
		ReceivePerPeer:    sz(c.ReceiveBudgetPerPeer),
		ReceiveWindow:     c.ReceiveWindow,
		InboxMessages:     c.InboxMessages,
		ChunkSize:         sz(c.ChunkSize),
		ChunksInFlight:    c.ChunksInFlight,
		DisableChannels:   c.DisableChannels,
		Nodes:             make([]fileNode, len(c.Nodes)),
	}
	if t := c.TLS; t != nil {
		f.TLS = &fileTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile, Data: t.Data}
	}
	for i, n := range c.Nodes {
		fn := fileNode{Name: n.Name, Address: n.Address, DataAddress: n.DataAddress, DisableChannels: n.DisableChannels}
		for _, d := range n.Devices {
			fn.Devices = append(fn.Devices, d.String())
		}
		f.Nodes[i] = fn
	}
	b, err := yaml.Marshal(&f)
	if err != nil {
		return nil, fmt.Errorf("cluster: marshal: %w", err)
	}
	return b, nil
}
