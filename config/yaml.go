package config

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
// Errors about the file's content are *Error values naming the line.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
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
// *Error naming the field and the line.
func Parse(data []byte, dir string) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{Err: err}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, &Error{Err: errors.New("empty document")}
	}
	c := &Config{dir: dir, lines: make(map[string]int)}
	// The booleans whose default is true: Validate cannot tell false
	// from unset.
	c.Transport.SharedMemory = true
	if err := c.decode(doc.Content[0]); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// at returns a *Error at node n.
func at(n *yaml.Node, field, format string, args ...any) error {
	return &Error{Line: n.Line, Field: field, Err: fmt.Errorf(format, args...)}
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

// movedKeys are the settings that moved from the top level of the file
// into a section; the error names the new place.
var movedKeys = map[string]string{
	"max_frame_size":          "transport.max_frame_size",
	"inline_threshold":        "transport.inline_threshold",
	"transfer_timeout":        "flow.transfer_timeout",
	"receive_budget":          "flow.receive_budget",
	"receive_budget_per_peer": "flow.receive_budget_per_peer",
	"receive_window":          "flow.receive_window",
	"inbox_messages":          "flow.inbox_messages",
	"chunk_size":              "staging.chunk_size",
	"chunks_in_flight":        "staging.chunks_in_flight",
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
		case "membership":
			c.Membership, err = scalar(v, field)
		case "disable_channels":
			c.DisableChannels, err = c.channels(v, field)
		case "nodes":
			err = c.decodeNodes(v, field)
		case "tls":
			err = c.decodeTLS(v, field)
		case "discovery":
			err = c.decodeDiscovery(v, field)
		case "transport":
			t := &c.Transport
			err = c.section(v, field, map[string]setter{
				"max_frame_size":          sizeOf(&t.MaxFrameSize),
				"inline_threshold":        sizeOf(&t.InlineThreshold),
				"inline_device":           boolOf(&t.InlineDevice),
				"send_queue":              countOf(&t.SendQueue),
				"handler_takeover":        durationOf(&t.HandlerTakeover),
				"max_data_conns_per_peer": countOf(&t.MaxDataConnsPerPeer),
				"max_data_conns":          countOf(&t.MaxDataConns),
				"data_idle_timeout":       durationOf(&t.DataIdleTimeout),
				"idle_timeout":            durationOf(&t.IdleTimeout),
				"read_spin":               readSpinOf(&t.ReadSpin),
				"read_spin_detach":        switchOf(&t.ReadSpinDetach),
				"caller_reads":            switchOf(&t.CallerReads),
				"burst_decode":            switchOf(&t.BurstDecode),
				"inline_delivery":         switchOf(&t.InlineDelivery),
				"direct_write":            switchOf(&t.DirectWrite),
				"shared_memory":           boolOf(&t.SharedMemory),
			})
		case "flow":
			f := &c.Flow
			err = c.section(v, field, map[string]setter{
				"transfer_timeout":        durationOf(&f.TransferTimeout),
				"ref_ttl":                 durationOf(&f.RefTTL),
				"max_in_flight":           countOf(&f.MaxInFlight),
				"max_in_flight_bytes":     sizeOf(&f.MaxInFlightBytes),
				"receive_budget":          sizeOf(&f.ReceiveBudget),
				"receive_budget_per_peer": sizeOf(&f.ReceiveBudgetPerPeer),
				"receive_window":          countOf(&f.ReceiveWindow),
				"inbox_messages":          countOf(&f.InboxMessages),
				"inbox_bytes":             sizeOf(&f.InboxBytes),
				"relay":                   notBoolOf(&f.NoRelay),
				"relay_min_bytes":         sizeOf(&f.RelayMinBytes),
				"relay_fanout":            countOf(&f.RelayFanout),
				"relay_stream":            notBoolOf(&f.NoRelayStream),
				"relay_push":              notBoolOf(&f.NoRelayPush),
			})
		case "staging":
			s := &c.Staging
			err = c.section(v, field, map[string]setter{
				"chunk_size":       sizeOf(&s.ChunkSize),
				"chunks_in_flight": countOf(&s.ChunksInFlight),
				"max_ring_bytes":   sizeOf(&s.MaxRingBytes),
				"stripes":          countOf(&s.Stripes),
				"stripe_min":       sizeOf(&s.StripeMin),
				"idle_timeout":     durationOf(&s.IdleTimeout),
			})
		case "ipc":
			i := &c.IPC
			err = c.section(v, field, map[string]setter{
				"shm_dir":          stringOf(&i.ShmDir),
				"challenge_ttl":    durationOf(&i.ChallengeTTL),
				"copy_chunk":       sizeOf(&i.CopyChunk),
				"copy_window":      countOf(&i.CopyWindow),
				"cancel_grace":     durationOf(&i.CancelGrace),
				"max_mappings":     countOf(&i.MaxMappings),
				"max_acquisitions": countOf(&i.MaxAcquisitions),
				"idle_lanes":       countOf(&i.IdleLanes),
				"direct_margin":    durationOf(&i.DirectMargin),
				"no_direct":        boolOf(&i.NoDirect),
			})
		case "verbs":
			vb := &c.Verbs
			err = c.section(v, field, map[string]setter{
				"device":             stringOf(&vb.Device),
				"port":               portOf(&vb.Port),
				"chunk_size":         sizeOf(&vb.ChunkSize),
				"window":             countOf(&vb.Window),
				"send_queue":         countOf(&vb.SendQueue),
				"cache_bytes":        sizeOf(&vb.CacheBytes),
				"cache_entries":      countOf(&vb.CacheEntries),
				"stall_timeout":      durationOf(&vb.StallTimeout),
				"ack_timeout":        byteOf(&vb.AckTimeout),
				"retry_count":        byteOf(&vb.RetryCount),
				"rnr_retry":          byteOf(&vb.RNRRetry),
				"max_rd_atomic":      byteOf(&vb.MaxRdAtomic),
				"max_dest_rd_atomic": byteOf(&vb.MaxDestRdAtomic),
				"min_rnr_timer":      byteOf(&vb.MinRNRTimer),
				"hop_limit":          byteOf(&vb.HopLimit),
				"traffic_class":      byteOf(&vb.TrafficClass),
				"service_level":      byteOf(&vb.ServiceLevel),
			})
		case "gossip":
			err = c.decodeGossip(v, field)
		case "memory":
			m := &c.Memory
			err = c.section(v, field, map[string]setter{
				"cuda_cache_bytes": sizeOf(&m.CUDACacheBytes),
			})
		default:
			if to, ok := movedKeys[k.Value]; ok {
				err = at(k, field, "moved to %s (a key of the %s section)", to, to[:strings.IndexByte(to, '.')])
			} else {
				err = at(k, field, "unknown key")
			}
		}
		return err
	})
}

// setter decodes the value v of field into its place.
type setter func(v *yaml.Node, field string) error

// section decodes the mapping v of the section named field, whose keys are
// those of keys.
func (c *Config) section(v *yaml.Node, field string, keys map[string]setter) error {
	return c.pairs(v, field+".", func(k *yaml.Node, field string, v *yaml.Node) error {
		set, ok := keys[k.Value]
		if !ok {
			return at(k, field, "unknown key")
		}
		return set(v, field)
	})
}

func sizeOf[T int | int64](p *T) setter {
	return func(v *yaml.Node, field string) (err error) {
		n, err := size(v, field)
		*p = T(n)
		return err
	}
}

func countOf(p *int) setter {
	return func(v *yaml.Node, field string) (err error) {
		*p, err = count(v, field)
		return err
	}
}

func durationOf(p *time.Duration) setter {
	return func(v *yaml.Node, field string) (err error) {
		*p, err = duration(v, field)
		return err
	}
}

// readSpinOf decodes a duration, or "off" (ReadSpinOff).
func readSpinOf(p *time.Duration) setter {
	return func(v *yaml.Node, field string) (err error) {
		if s, serr := scalar(v, field); serr == nil && s == "off" {
			*p = ReadSpinOff
			return nil
		}
		*p, err = duration(v, field)
		return err
	}
}

// switchOf decodes a Switch: auto, on or off (true, false).
func switchOf(p *Switch) setter {
	return func(v *yaml.Node, field string) error {
		s, err := scalar(v, field)
		if err != nil {
			return err
		}
		var ok bool
		if *p, ok = parseSwitch(s); !ok {
			return at(v, field, "want auto, on or off, got %q", s)
		}
		return nil
	}
}

// relayOff is what the file says of an on-by-default switch (relay,
// relay_stream): only false, when off.
func relayOff(no bool) *bool {
	if !no {
		return nil
	}
	off := false
	return &off
}

func boolOf(p *bool) setter {
	return func(v *yaml.Node, field string) (err error) {
		*p, err = boolean(v, field)
		return err
	}
}

// notBoolOf sets *p to the negation of a boolean (relay: false sets NoRelay).
func notBoolOf(p *bool) setter {
	return func(v *yaml.Node, field string) error {
		b, err := boolean(v, field)
		*p = !b
		return err
	}
}

func stringOf(p *string) setter {
	return func(v *yaml.Node, field string) (err error) {
		*p, err = scalar(v, field)
		return err
	}
}

// byteOf decodes an integer in 0..255; 0 means the default.
func byteOf(p *uint8) setter {
	return func(v *yaml.Node, field string) error {
		s, err := scalar(v, field)
		if err != nil {
			return err
		}
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return at(v, field, "bad value %q: want an integer in 0..255", s)
		}
		*p = uint8(n)
		return nil
	}
}

func portOf(p *uint8) setter {
	return func(v *yaml.Node, field string) error {
		s, err := scalar(v, field)
		if err != nil {
			return err
		}
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil || n == 0 {
			return at(v, field, "bad port %q: want 1..255", s)
		}
		*p = uint8(n)
		return nil
	}
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
			case "gossip_address":
				n.GossipAddress, err = scalar(v, field)
			case "mesh_only":
				n.MeshOnly, err = boolean(v, field)
			case "devices":
				n.Devices, err = c.devices(v, field)
			case "disable_channels":
				n.DisableChannels, err = c.channels(v, field)
			case "metrics_address":
				n.MetricsAddress, err = scalar(v, field)
			case "pprof":
				n.Pprof, err = boolean(v, field)
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
			return nil, &Error{Line: resolve(v.Content[i]).Line, Field: fmt.Sprintf("%s[%d]", field, i), Err: err}
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
		return 0, &Error{Line: v.Line, Field: field, Err: err}
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
	Cluster           string         `yaml:"cluster"`
	SecretFile        string         `yaml:"secret_file,omitempty"`
	SecretEnv         string         `yaml:"secret_env,omitempty"`
	SecretInsecure    bool           `yaml:"secret_file_insecure,omitempty"`
	HeartbeatInterval string         `yaml:"heartbeat_interval,omitempty"`
	FailureTimeout    string         `yaml:"failure_timeout,omitempty"`
	DialTimeout       string         `yaml:"dial_timeout,omitempty"`
	ReconnectMin      string         `yaml:"reconnect_min,omitempty"`
	ReconnectMax      string         `yaml:"reconnect_max,omitempty"`
	Membership        string         `yaml:"membership,omitempty"`
	DisableChannels   []string       `yaml:"disable_channels,omitempty,flow"`
	TLS               *fileTLS       `yaml:"tls,omitempty"`
	Transport         *fileTransport `yaml:"transport,omitempty"`
	Flow              *fileFlow      `yaml:"flow,omitempty"`
	Staging           *fileStaging   `yaml:"staging,omitempty"`
	IPC               *fileIPC       `yaml:"ipc,omitempty"`
	Verbs             *fileVerbs     `yaml:"verbs,omitempty"`
	Memory            *fileMemory    `yaml:"memory,omitempty"`
	Gossip            *fileGossip    `yaml:"gossip,omitempty"`
	Discovery         *fileDiscovery `yaml:"discovery,omitempty"`
	Nodes             []fileNode     `yaml:"nodes"`
}

type fileTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
	Data     bool   `yaml:"data,omitempty"`
}

type fileTransport struct {
	MaxFrameSize        string `yaml:"max_frame_size,omitempty"`
	InlineThreshold     string `yaml:"inline_threshold,omitempty"`
	InlineDevice        bool   `yaml:"inline_device,omitempty"`
	SendQueue           int    `yaml:"send_queue,omitempty"`
	HandlerTakeover     string `yaml:"handler_takeover,omitempty"`
	MaxDataConnsPerPeer int    `yaml:"max_data_conns_per_peer,omitempty"`
	MaxDataConns        int    `yaml:"max_data_conns,omitempty"`
	DataIdleTimeout     string `yaml:"data_idle_timeout,omitempty"`
	IdleTimeout         string `yaml:"idle_timeout,omitempty"`
	ReadSpin            string `yaml:"read_spin,omitempty"`
	ReadSpinDetach      string `yaml:"read_spin_detach,omitempty"`
	CallerReads         string `yaml:"caller_reads,omitempty"`
	BurstDecode         string `yaml:"burst_decode,omitempty"`
	InlineDelivery      string `yaml:"inline_delivery,omitempty"`
	DirectWrite         string `yaml:"direct_write,omitempty"`
	SharedMemory        *bool  `yaml:"shared_memory,omitempty"` // written only when off
}

type fileFlow struct {
	TransferTimeout      string `yaml:"transfer_timeout,omitempty"`
	RefTTL               string `yaml:"ref_ttl,omitempty"`
	MaxInFlight          int    `yaml:"max_in_flight,omitempty"`
	MaxInFlightBytes     string `yaml:"max_in_flight_bytes,omitempty"`
	ReceiveBudget        string `yaml:"receive_budget,omitempty"`
	ReceiveBudgetPerPeer string `yaml:"receive_budget_per_peer,omitempty"`
	ReceiveWindow        int    `yaml:"receive_window,omitempty"`
	InboxMessages        int    `yaml:"inbox_messages,omitempty"`
	InboxBytes           string `yaml:"inbox_bytes,omitempty"`
	Relay                *bool  `yaml:"relay,omitempty"` // written only when off
	RelayMinBytes        string `yaml:"relay_min_bytes,omitempty"`
	RelayFanout          int    `yaml:"relay_fanout,omitempty"`
	RelayStream          *bool  `yaml:"relay_stream,omitempty"` // written only when off
	RelayPush            *bool  `yaml:"relay_push,omitempty"`   // written only when off
}

type fileStaging struct {
	ChunkSize      string `yaml:"chunk_size,omitempty"`
	ChunksInFlight int    `yaml:"chunks_in_flight,omitempty"`
	MaxRingBytes   string `yaml:"max_ring_bytes,omitempty"`
	Stripes        int    `yaml:"stripes,omitempty"`
	StripeMin      string `yaml:"stripe_min,omitempty"`
	IdleTimeout    string `yaml:"idle_timeout,omitempty"`
}

type fileIPC struct {
	ShmDir          string `yaml:"shm_dir,omitempty"`
	ChallengeTTL    string `yaml:"challenge_ttl,omitempty"`
	CopyChunk       string `yaml:"copy_chunk,omitempty"`
	CopyWindow      int    `yaml:"copy_window,omitempty"`
	CancelGrace     string `yaml:"cancel_grace,omitempty"`
	MaxMappings     int    `yaml:"max_mappings,omitempty"`
	MaxAcquisitions int    `yaml:"max_acquisitions,omitempty"`
	IdleLanes       int    `yaml:"idle_lanes,omitempty"`
	DirectMargin    string `yaml:"direct_margin,omitempty"`
	NoDirect        bool   `yaml:"no_direct,omitempty"`
}

type fileVerbs struct {
	Device       string `yaml:"device,omitempty"`
	Port         uint8  `yaml:"port,omitempty"`
	ChunkSize    string `yaml:"chunk_size,omitempty"`
	Window       int    `yaml:"window,omitempty"`
	SendQueue    int    `yaml:"send_queue,omitempty"`
	CacheBytes   string `yaml:"cache_bytes,omitempty"`
	CacheEntries int    `yaml:"cache_entries,omitempty"`
	StallTimeout string `yaml:"stall_timeout,omitempty"`

	AckTimeout      uint8 `yaml:"ack_timeout,omitempty"`
	RetryCount      uint8 `yaml:"retry_count,omitempty"`
	RNRRetry        uint8 `yaml:"rnr_retry,omitempty"`
	MaxRdAtomic     uint8 `yaml:"max_rd_atomic,omitempty"`
	MaxDestRdAtomic uint8 `yaml:"max_dest_rd_atomic,omitempty"`
	MinRNRTimer     uint8 `yaml:"min_rnr_timer,omitempty"`
	HopLimit        uint8 `yaml:"hop_limit,omitempty"`
	TrafficClass    uint8 `yaml:"traffic_class,omitempty"`
	ServiceLevel    uint8 `yaml:"service_level,omitempty"`
}

type fileMemory struct {
	CUDACacheBytes string `yaml:"cuda_cache_bytes,omitempty"`
}

type fileNode struct {
	Name            string   `yaml:"name"`
	Address         string   `yaml:"address"`
	DataAddress     string   `yaml:"data_address,omitempty"`
	GossipAddress   string   `yaml:"gossip_address,omitempty"`
	MeshOnly        bool     `yaml:"mesh_only,omitempty"`
	Devices         []string `yaml:"devices,omitempty,flow"`
	DisableChannels []string `yaml:"disable_channels,omitempty,flow"`
	MetricsAddress  string   `yaml:"metrics_address,omitempty"`
	Pprof           bool     `yaml:"pprof,omitempty"`
}

// nonZero returns p, or nil when *p is its type's zero value, so that an
// empty section is left out.
func nonZero[T comparable](p *T) *T {
	var zero T
	if *p == zero {
		return nil
	}
	return p
}

// Marshal writes c as YAML that Parse reads back. The secret itself is never
// written, only SecretFile or SecretEnv, so one of them must be set (see
// WriteFiles for configs that hold only Secret). Zero settings are left out
// and take their defaults when read back.
func (c *Config) Marshal() ([]byte, error) {
	if c.SecretFile == "" && c.SecretEnv == "" {
		return nil, errors.New("config: marshal: set SecretFile or SecretEnv (the secret itself is never written; WriteFiles writes it to a file)")
	}
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	sz := func(n int64) string {
		if n == 0 {
			return ""
		}
		return FormatSize(int(n))
	}
	t, fl, st, ip, vb := c.Transport, c.Flow, c.Staging, c.IPC, c.Verbs
	ft := fileTransport{
		MaxFrameSize: sz(int64(t.MaxFrameSize)), InlineThreshold: sz(int64(t.InlineThreshold)),
		InlineDevice: t.InlineDevice,
		SendQueue:    t.SendQueue, HandlerTakeover: dur(t.HandlerTakeover),
		MaxDataConnsPerPeer: t.MaxDataConnsPerPeer, MaxDataConns: t.MaxDataConns,
		DataIdleTimeout: dur(t.DataIdleTimeout), IdleTimeout: dur(t.IdleTimeout),
	}
	switch {
	case t.ReadSpin < 0:
		ft.ReadSpin = "off"
	case t.ReadSpin > 0:
		ft.ReadSpin = dur(t.ReadSpin)
	}
	if !t.SharedMemory {
		off := false
		ft.SharedMemory = &off
	}
	for _, s := range []struct {
		to *string
		s  Switch
	}{{&ft.ReadSpinDetach, t.ReadSpinDetach}, {&ft.CallerReads, t.CallerReads}, {&ft.BurstDecode, t.BurstDecode}, {&ft.InlineDelivery, t.InlineDelivery}, {&ft.DirectWrite, t.DirectWrite}} {
		if s.s != SwitchAuto {
			*s.to = s.s.String()
		}
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
		Membership:        c.Membership,
		ReconnectMax:      dur(c.ReconnectMax),
		DisableChannels:   c.DisableChannels,
		Transport:         &ft,
		Flow: nonZero(&fileFlow{
			TransferTimeout: dur(fl.TransferTimeout), RefTTL: dur(fl.RefTTL),
			MaxInFlight: fl.MaxInFlight, MaxInFlightBytes: sz(fl.MaxInFlightBytes),
			ReceiveBudget: sz(fl.ReceiveBudget), ReceiveBudgetPerPeer: sz(fl.ReceiveBudgetPerPeer),
			ReceiveWindow: fl.ReceiveWindow, InboxMessages: fl.InboxMessages, InboxBytes: sz(fl.InboxBytes),
			Relay: relayOff(fl.NoRelay), RelayMinBytes: sz(fl.RelayMinBytes), RelayFanout: fl.RelayFanout, RelayStream: relayOff(fl.NoRelayStream), RelayPush: relayOff(fl.NoRelayPush),
		}),
		Staging: nonZero(&fileStaging{
			ChunkSize: sz(int64(st.ChunkSize)), ChunksInFlight: st.ChunksInFlight,
			MaxRingBytes: sz(int64(st.MaxRingBytes)), Stripes: st.Stripes, StripeMin: sz(st.StripeMin),
			IdleTimeout: dur(st.IdleTimeout),
		}),
		IPC: nonZero(&fileIPC{
			ShmDir: ip.ShmDir, ChallengeTTL: dur(ip.ChallengeTTL), CopyChunk: sz(int64(ip.CopyChunk)),
			CopyWindow: ip.CopyWindow, CancelGrace: dur(ip.CancelGrace), MaxMappings: ip.MaxMappings,
			MaxAcquisitions: ip.MaxAcquisitions, IdleLanes: ip.IdleLanes, DirectMargin: dur(ip.DirectMargin),
			NoDirect: ip.NoDirect,
		}),
		Verbs: nonZero(&fileVerbs{
			Device: vb.Device, Port: vb.Port, ChunkSize: sz(int64(vb.ChunkSize)), Window: vb.Window,
			SendQueue: vb.SendQueue, CacheBytes: sz(vb.CacheBytes), CacheEntries: vb.CacheEntries,
			StallTimeout: dur(vb.StallTimeout),
			AckTimeout:   vb.AckTimeout, RetryCount: vb.RetryCount, RNRRetry: vb.RNRRetry,
			MaxRdAtomic: vb.MaxRdAtomic, MaxDestRdAtomic: vb.MaxDestRdAtomic, MinRNRTimer: vb.MinRNRTimer,
			HopLimit: vb.HopLimit, TrafficClass: vb.TrafficClass, ServiceLevel: vb.ServiceLevel,
		}),
		Memory: nonZero(&fileMemory{CUDACacheBytes: sz(c.Memory.CUDACacheBytes)}),
		Gossip: c.Gossip.file(),
		Nodes:  make([]fileNode, len(c.Nodes)),
	}
	f.Transport = nonZero(f.Transport)
	f.Discovery = c.Discovery.file()
	if t := c.TLS; t != nil {
		f.TLS = &fileTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile, Data: t.Data}
	}
	for i, n := range c.Nodes {
		fn := fileNode{Name: n.Name, Address: n.Address, DataAddress: n.DataAddress, GossipAddress: n.GossipAddress, MeshOnly: n.MeshOnly, DisableChannels: n.DisableChannels,
			MetricsAddress: n.MetricsAddress, Pprof: n.Pprof}
		for _, d := range n.Devices {
			fn.Devices = append(fn.Devices, d.String())
		}
		f.Nodes[i] = fn
	}
	b, err := yaml.Marshal(&f)
	if err != nil {
		return nil, fmt.Errorf("config: marshal: %w", err)
	}
	return b, nil
}
