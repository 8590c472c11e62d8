package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/transfer"
	"time"
)

// Options configure what a node's metrics hold and how they are served.
type Options struct {
	// PeerLabels adds a "peer" label to the per-peer families (transfers
	// and bytes fetched, latency, per-peer budgets and credits, peer_up):
	// one series per peer, so off by default (cardinality grows with the
	// cluster).
	PeerLabels bool
	// Pprof serves net/http/pprof's handlers under /debug/pprof on the
	// metrics listener (default off).
	Pprof bool
	// MaxConns bounds the connections Serve holds open at once (default
	// DefaultMaxConns, 64); more wait in the kernel's accept queue, so a
	// client that opens thousands costs no descriptors of the node.
	MaxConns int
	// IdleTimeout closes a keep-alive connection idle that long (default
	// DefaultIdleTimeout, 30 s); a request must arrive, headers and body,
	// within DefaultReadTimeout (10 s) and its answer be written within
	// DefaultWriteTimeout (60 s: pprof's profiles take 30 s by default).
	IdleTimeout time.Duration
}

// Defaults of the metrics listener's bounds (Options).
const (
	DefaultMaxConns     = 64
	DefaultIdleTimeout  = 30 * time.Second
	DefaultReadTimeout  = 10 * time.Second
	DefaultWriteTimeout = 60 * time.Second
)

// desc is one family's description.
type desc struct {
	name, help string
	labels     []string
}

// Names of the label keys.
const (
	labelNode      = "node"
	labelChannel   = "channel"
	labelDirection = "direction"
	labelPeer      = "peer"
	labelReason    = "reason"
	labelCache     = "cache"
	labelPurpose   = "purpose"
	labelTransport = "transport"
)

// The families, in the order of doc.go. Every series has the "node"
// label: one process may run several nodes (the samples' embedded
// clusters).
var families = []desc{
	{"tensorferry_messages_sent_total", "Messages this node sent to actors of other nodes.", nil},
	{"tensorferry_messages_received_total", "Messages this node received from other nodes.", nil},
	{"tensorferry_dead_letters_total", "Messages from other nodes to actors of this node that do not exist.", nil},
	{"tensorferry_delivery_failures_total", "Messages that could not be delivered (reported to their sender).", nil},
	{"tensorferry_tensors_exported_total", "Tensors this node lent in messages (exported instead of copied inline).", nil},
	{"tensorferry_transfers_total", "Tensor transfers by data channel and direction (in: fetched into this node; out: served from it, staging only).", []string{labelChannel, labelDirection}},
	{"tensorferry_transfer_bytes_total", "Bytes of tensor transfers by data channel and direction.", []string{labelChannel, labelDirection}},
	{"tensorferry_transfer_duration_seconds", "Time of one fetch over a data channel, from its start to its last byte.", []string{labelChannel}},
	{"tensorferry_transfer_failures_total", "Fetches that failed (or messages refused before them), by reason.", []string{labelReason}},
	{"tensorferry_inbox_refused_total", "Messages refused because their sender's inbox on this node was full.", nil},
	{"tensorferry_reader_deliveries_total", "Messages with tensors fetched and delivered on the connection's reader, without the delivery loop.", nil},
	{"tensorferry_regcache_hits_total", "Registration cache lookups served by an existing registration.", []string{labelCache}},
	{"tensorferry_regcache_misses_total", "Registration cache lookups that registered memory.", []string{labelCache}},
	{"tensorferry_regcache_evictions_total", "Idle registrations unregistered to fit the cache's budget.", []string{labelCache}},
	{"tensorferry_regcache_invalidations_total", "Registrations dropped because their memory was freed or their peer went down.", []string{labelCache}},
	{"tensorferry_regcache_registered_bytes", "Bytes registered in the cache now.", []string{labelCache}},
	{"tensorferry_regcache_entries", "Registrations held in the cache now.", []string{labelCache}},
	{"tensorferry_leases_outstanding", "Tensors this node lent that are not released yet.", nil},
	{"tensorferry_lent_bytes", "Bytes of the tensors this node lent that are not released yet.", nil},
	{"tensorferry_receive_budget_bytes", "The node's receive budget: the most it allocates at once for tensors being fetched.", nil},
	{"tensorferry_receive_budget_in_use_bytes", "What the node has allocated now for tensors being fetched.", nil},
	{"tensorferry_receive_budget_waiting_messages", "Messages whose fetches wait for room in the node's or their peer's receive budget.", nil},
	{"tensorferry_peer_receive_budget_in_use_bytes", "What one peer's messages hold of this node's receive budget (with peer labels).", []string{labelPeer}},
	{"tensorferry_credits_in_use", "Messages sent whose tensors the receiver has not fetched yet (they hold the sender's credits).", nil},
	{"tensorferry_credit_waits_total", "Messages with tensors that waited for their receiver's credits.", nil},
	{"tensorferry_relay_served_total", "Copies this node lent to other receivers of the same content (fan-out by relay).", nil},
	{"tensorferry_relay_fetched_total", "Fetches from another receiver of the same content, as its owner asked.", nil},
	{"tensorferry_relay_fallbacks_total", "Fetches from the owner after the receiver it named could not serve.", nil},
	{"tensorferry_relay_pushed_total", "Of the relayed fetches, those the receiver the owner named wrote into this node's destination itself (relay by push).", nil},
	{"tensorferry_credit_wait_seconds_total", "Time messages waited for their receiver's credits, in all.", nil},
	{"tensorferry_peers_up", "Other nodes of the cluster that are up.", nil},
	{"tensorferry_peer_up", "Whether a peer is up (1) or not (0) (with peer labels).", []string{labelPeer}},
	{"tensorferry_node_down_total", "NodeDown events this node published.", nil},
	{"tensorferry_connections", "Open connections by purpose (control, data) and transport.", []string{labelPurpose, labelTransport}},
}

// FamilyNames returns the names of the families a node's collector
// exports (the histogram's series add _bucket, _sum and _count).
func FamilyNames() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.name
	}
	return out
}

// Collector is a prometheus.Collector of one node's metrics. It reads the
// node's counters (actor.Node.Stats) at each scrape: the paths it measures
// pay nothing for it beyond the counters they keep anyway.
type Collector struct {
	node  *actor.Node
	opts  Options
	descs map[string]*prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the collector of n's metrics. Register it with a
// prometheus.Registerer (Serve does, with its own registry).
func NewCollector(n *actor.Node, opts Options) *Collector {
	c := &Collector{node: n, opts: opts, descs: map[string]*prometheus.Desc{}}
	for _, f := range families {
		labels := append([]string{labelNode}, f.labels...)
		if opts.PeerLabels && peerLabelled(f.name) {
			labels = append(labels, labelPeer)
		}
		c.descs[f.name] = prometheus.NewDesc(f.name, f.help, labels, nil)
	}
	return c
}

// peerLabelled reports the families that get a peer label with
// Options.PeerLabels (besides those that always have one).
func peerLabelled(name string) bool {
	switch name {
	case "tensorferry_transfers_total", "tensorferry_transfer_bytes_total",
		"tensorferry_transfer_duration_seconds", "tensorferry_credits_in_use":
		return true
	}
	return false
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.node.Stats()
	node := c.node.Name()
	counter := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, v, append([]string{node}, labels...)...)
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, append([]string{node}, labels...)...)
	}
	counter("tensorferry_messages_sent_total", float64(s.MessagesSent))
	counter("tensorferry_messages_received_total", float64(s.MessagesReceived))
	counter("tensorferry_dead_letters_total", float64(s.DeadLetters))
	counter("tensorferry_delivery_failures_total", float64(s.DeliveryFailures))
	counter("tensorferry_tensors_exported_total", float64(s.TensorsExported))

	histogram := func(cs transfer.ChannelStats, labels ...string) {
		buckets := make(map[float64]uint64, len(transfer.LatencyBounds))
		var cum uint64
		for i, b := range transfer.LatencyBounds {
			cum += uint64(cs.Latency[i])
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.descs["tensorferry_transfer_duration_seconds"],
			uint64(cs.Transfers), cs.Time.Seconds(), buckets, append([]string{node}, labels...)...)
	}
	if c.opts.PeerLabels {
		for peer, chans := range s.ByPeer {
			for name, cs := range chans {
				counter("tensorferry_transfers_total", float64(cs.Transfers), name, "in", peer)
				counter("tensorferry_transfer_bytes_total", float64(cs.Bytes), name, "in", peer)
				histogram(cs, name, peer)
			}
		}
		for name, cs := range s.Served {
			counter("tensorferry_transfers_total", float64(cs.Transfers), name, "out", "")
			counter("tensorferry_transfer_bytes_total", float64(cs.Bytes), name, "out", "")
		}
	} else {
		for name, cs := range s.Channels {
			counter("tensorferry_transfers_total", float64(cs.Transfers), name, "in")
			counter("tensorferry_transfer_bytes_total", float64(cs.Bytes), name, "in")
			histogram(cs, name)
		}
		for name, cs := range s.Served {
			counter("tensorferry_transfers_total", float64(cs.Transfers), name, "out")
			counter("tensorferry_transfer_bytes_total", float64(cs.Bytes), name, "out")
		}
	}
	for reason, n := range s.FailedTransfers {
		counter("tensorferry_transfer_failures_total", float64(n), reason)
	}
	counter("tensorferry_inbox_refused_total", float64(s.InboxRefused))
	counter("tensorferry_reader_deliveries_total", float64(s.ReaderDeliveries))
	for name, rs := range s.RegCaches {
		counter("tensorferry_regcache_hits_total", float64(rs.Hits), name)
		counter("tensorferry_regcache_misses_total", float64(rs.Misses), name)
		counter("tensorferry_regcache_evictions_total", float64(rs.Evictions), name)
		counter("tensorferry_regcache_invalidations_total", float64(rs.Invalidations), name)
		gauge("tensorferry_regcache_registered_bytes", float64(rs.Bytes), name)
		gauge("tensorferry_regcache_entries", float64(rs.Registered), name)
	}
	gauge("tensorferry_leases_outstanding", float64(s.Exports))
	gauge("tensorferry_lent_bytes", float64(s.LentBytes))
	gauge("tensorferry_receive_budget_bytes", float64(s.Budget))
	gauge("tensorferry_receive_budget_in_use_bytes", float64(s.BudgetInUse))
	gauge("tensorferry_receive_budget_waiting_messages", float64(s.BudgetWaiting))
	var credits int
	for peer, ps := range s.Peers {
		credits += ps.CreditsInUse
		if c.opts.PeerLabels {
			gauge("tensorferry_peer_receive_budget_in_use_bytes", float64(ps.BudgetInUse), peer)
			gauge("tensorferry_credits_in_use", float64(ps.CreditsInUse), peer)
		}
	}
	if !c.opts.PeerLabels {
		gauge("tensorferry_credits_in_use", float64(credits))
	}
	counter("tensorferry_credit_waits_total", float64(s.CreditWaits))
	counter("tensorferry_relay_served_total", float64(s.RelayServed))
	counter("tensorferry_relay_fetched_total", float64(s.RelayFetched))
	counter("tensorferry_relay_fallbacks_total", float64(s.RelayFallbacks))
	counter("tensorferry_relay_pushed_total", float64(s.RelayPushed))
	counter("tensorferry_credit_wait_seconds_total", s.CreditWait.Seconds())
	up := 0
	for peer, isUp := range s.PeersUp {
		v := 0.0
		if isUp {
			up++
			v = 1
		}
		if c.opts.PeerLabels {
			gauge("tensorferry_peer_up", v, peer)
		}
	}
	gauge("tensorferry_peers_up", float64(up))
	counter("tensorferry_node_down_total", float64(s.NodeDowns))
	for k, n := range s.Conns {
		gauge("tensorferry_connections", float64(n), k.Purpose, k.Transport)
	}
}
