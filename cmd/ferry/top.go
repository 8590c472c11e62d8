package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"golang.org/x/term"
	"gopkg.in/yaml.v3"
)

// maxScrape bounds the bytes read from one metrics endpoint;
// scrapeTimeout the time one scrape may take (or the refresh period, when
// longer).
const (
	maxScrape     = 16 << 20
	scrapeTimeout = 5 * time.Second
)

func runTop(args []string, stdout io.Writer) error {
	return top(args, os.Stdin, stdout)
}

// top runs `ferry top`, reading keys from in (put in raw mode when it is a
// terminal) and drawing on out.
func top(args []string, in *os.File, out io.Writer) error {
	fs := newFlags("top")
	config := fs.String("config", "", "cluster config file (YAML): scrape every node's metrics_address")
	targets := fs.String("targets", "", "comma-separated host:port metrics addresses to scrape (besides the config's)")
	interval := fs.Duration("interval", time.Second, "refresh period")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addrs, err := topTargets(*config, *targets)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if len(addrs) == 0 {
		return &exitError{code: 2, err: errors.New("no metrics address: give --config (nodes with metrics_address) or --targets")}
	}
	if *interval <= 0 {
		return &exitError{code: 2, err: errors.New("--interval must be positive")}
	}
	nl := "\n"
	if term.IsTerminal(int(in.Fd())) {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		nl = "\r\n" // raw mode: no output processing either
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	quit := make(chan struct{})
	go readKeys(in, quit)
	go func() {
		<-quit
		cancel() // a scrape under way ends now
	}()

	// A slow node delays the frame rather than vanish from it.
	s := &scraper{client: &http.Client{Timeout: max(*interval, scrapeTimeout)}, targets: addrs}
	var prev *topSample
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		cur := s.scrape(ctx)
		if ctx.Err() != nil { // q pressed during the scrape
			io.WriteString(out, nl)
			return nil
		}
		io.WriteString(out, "\x1b[H\x1b[2J"+strings.ReplaceAll(render(prev, cur, *interval), "\n", nl))
		prev = cur
		select {
		case <-tick.C:
		case <-quit:
			io.WriteString(out, nl)
			return nil
		case <-sig:
			io.WriteString(out, nl)
			return nil
		}
	}
}

// readKeys closes quit when q, Q or Ctrl-C (raw mode) is read from in, or
// in ends.
func readKeys(in io.Reader, quit chan<- struct{}) {
	defer close(quit)
	var b [64]byte
	for {
		n, err := in.Read(b[:])
		for _, c := range b[:n] {
			if c == 'q' || c == 'Q' || c == 3 {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// topTargets returns the metrics addresses of the nodes in the config
// file (their metrics_address), then those of list.
func topTargets(config, list string) ([]string, error) {
	var out []string
	if config != "" {
		b, err := os.ReadFile(config)
		if err != nil {
			return nil, err
		}
		var c struct {
			Nodes []struct {
				Name           string `yaml:"name"`
				MetricsAddress string `yaml:"metrics_address"`
			} `yaml:"nodes"`
		}
		if err := yaml.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", config, err)
		}
		for _, n := range c.Nodes {
			if n.MetricsAddress != "" {
				out = append(out, n.MetricsAddress)
			}
		}
	}
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// scraper fetches every target's metrics.
type scraper struct {
	client  *http.Client
	targets []string
}

// topSample is what one round of scrapes saw, by node.
type topSample struct {
	at     time.Time
	nodes  map[string]*nodeSample
	errors []string
}

// nodeSample is one node's figures.
type nodeSample struct {
	channels     map[string]*channelSample
	msgsSent     float64
	msgsReceived float64
	peersUp      float64
	leases       float64
	lentBytes    float64
	budget       float64
	budgetInUse  float64
	waiting      float64
	credits      float64
	cacheHits    float64
	cacheMisses  float64
	hasCache     bool
}

// channelSample is one node's figures for one channel.
type channelSample struct {
	bytesIn, bytesOut float64
	transfers         float64 // in
	buckets           []bucket
	count             float64
}

type bucket struct{ upper, cum float64 }

func (s *scraper) scrape(ctx context.Context) *topSample {
	out := &topSample{at: time.Now(), nodes: map[string]*nodeSample{}}
	fams := make([]map[string]*dto.MetricFamily, len(s.targets))
	errs := make([]error, len(s.targets))
	var wg sync.WaitGroup
	for i, addr := range s.targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fams[i], errs[i] = s.fetch(ctx, addr)
		}()
	}
	wg.Wait()
	for i, addr := range s.targets {
		if errs[i] != nil {
			out.errors = append(out.errors, fmt.Sprintf("%s: %v", addr, errs[i]))
			continue
		}
		out.add(fams[i])
	}
	return out
}

func (s *scraper) fetch(ctx context.Context, addr string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	var p expfmt.TextParser
	return p.TextToMetricFamilies(io.LimitReader(resp.Body, maxScrape))
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// add folds one target's families into t.
func (t *topSample) add(fams map[string]*dto.MetricFamily) {
	node := func(m *dto.Metric) *nodeSample {
		name := label(m, "node")
		n := t.nodes[name]
		if n == nil {
			n = &nodeSample{channels: map[string]*channelSample{}}
			t.nodes[name] = n
		}
		return n
	}
	channel := func(m *dto.Metric) *channelSample {
		n := node(m)
		name := label(m, "channel")
		c := n.channels[name]
		if c == nil {
			c = &channelSample{}
			n.channels[name] = c
		}
		return c
	}
	each := func(family string, f func(m *dto.Metric, v float64)) {
		if mf := fams[family]; mf != nil {
			for _, m := range mf.GetMetric() {
				f(m, value(m))
			}
		}
	}
	each("tensorferry_messages_sent_total", func(m *dto.Metric, v float64) { node(m).msgsSent += v })
	each("tensorferry_messages_received_total", func(m *dto.Metric, v float64) { node(m).msgsReceived += v })
	each("tensorferry_peers_up", func(m *dto.Metric, v float64) { node(m).peersUp += v })
	each("tensorferry_leases_outstanding", func(m *dto.Metric, v float64) { node(m).leases += v })
	each("tensorferry_lent_bytes", func(m *dto.Metric, v float64) { node(m).lentBytes += v })
	each("tensorferry_receive_budget_bytes", func(m *dto.Metric, v float64) { node(m).budget += v })
	each("tensorferry_receive_budget_in_use_bytes", func(m *dto.Metric, v float64) { node(m).budgetInUse += v })
	each("tensorferry_receive_budget_waiting_messages", func(m *dto.Metric, v float64) { node(m).waiting += v })
	each("tensorferry_credits_in_use", func(m *dto.Metric, v float64) { node(m).credits += v })
	each("tensorferry_regcache_hits_total", func(m *dto.Metric, v float64) { n := node(m); n.cacheHits += v; n.hasCache = true })
	each("tensorferry_regcache_misses_total", func(m *dto.Metric, v float64) { n := node(m); n.cacheMisses += v; n.hasCache = true })
	each("tensorferry_transfer_bytes_total", func(m *dto.Metric, v float64) {
		if label(m, "direction") == "out" {
			channel(m).bytesOut += v
		} else {
			channel(m).bytesIn += v
		}
	})
	each("tensorferry_transfers_total", func(m *dto.Metric, v float64) {
		if label(m, "direction") != "out" {
			channel(m).transfers += v
		}
	})
	if mf := fams["tensorferry_transfer_duration_seconds"]; mf != nil {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			c := channel(m)
			c.count += float64(h.GetSampleCount())
			c.buckets = mergeBuckets(c.buckets, h.GetBucket())
		}
	}
}

// mergeBuckets adds the cumulative buckets of one series (peer labels
// split a channel's histogram) to acc.
func mergeBuckets(acc []bucket, bs []*dto.Bucket) []bucket {
	for _, b := range bs {
		i := slices.IndexFunc(acc, func(x bucket) bool { return x.upper == b.GetUpperBound() })
		if i < 0 {
			acc = append(acc, bucket{upper: b.GetUpperBound()})
			i = len(acc) - 1
		}
		acc[i].cum += float64(b.GetCumulativeCount())
	}
	slices.SortFunc(acc, func(a, b bucket) int { return cmpFloat(a.upper, b.upper) })
	return acc
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// quantile estimates the q-quantile of a histogram from its cumulative
// buckets and count as Prometheus' histogram_quantile does: linear within
// the bucket; the last finite bound for what lies above it. NaN when
// empty.
func quantile(q float64, bs []bucket, count float64) float64 {
	if count <= 0 || len(bs) == 0 {
		return math.NaN()
	}
	rank := q * count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.cum >= rank {
			if math.IsInf(b.upper, 1) {
				return lower
			}
			if b.cum == below {
				return b.upper
			}
			return lower + (b.upper-lower)*(rank-below)/(b.cum-below)
		}
		lower, below = b.upper, b.cum
	}
	return bs[len(bs)-1].upper
}

// deltaBuckets returns cur's buckets minus prev's (same bounds), or nil.
func deltaBuckets(cur, prev []bucket) []bucket {
	out := make([]bucket, len(cur))
	for i, b := range cur {
		out[i] = b
		for _, p := range prev {
			if p.upper == b.upper {
				out[i].cum -= p.cum
			}
		}
	}
	return out
}

// render draws one frame: rates are over the time between prev and cur
// (blank on the first frame); latency quantiles are over the transfers of
// that interval, or over all of them (marked *) when none happened in it.
func render(prev, cur *topSample, interval time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ferry top: %d nodes, every %v; q or Ctrl-C quits   %s\n\n", len(cur.nodes), interval, cur.at.Format("15:04:05"))
	names := make([]string, 0, len(cur.nodes))
	for n := range cur.nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	var dt float64
	if prev != nil {
		dt = cur.at.Sub(prev.at).Seconds()
	}
	rate := func(now, before float64, had bool) string {
		if !had || dt <= 0 || now < before {
			return "-"
		}
		return fmt.Sprintf("%.1f", (now-before)/dt)
	}
	byteRate := func(now, before float64, had bool) string {
		if !had || dt <= 0 || now < before {
			return "-"
		}
		return formatBytes((now-before)/dt) + "/s"
	}
	fmt.Fprintf(&b, "%-10s %-8s %12s %12s %10s %10s %10s\n", "NODE", "CHANNEL", "IN", "OUT", "XFERS/s", "P50", "P99")
	for _, name := range names {
		n := cur.nodes[name]
		var pn *nodeSample
		if prev != nil {
			pn = prev.nodes[name]
		}
		chans := make([]string, 0, len(n.channels))
		for c := range n.channels {
			chans = append(chans, c)
		}
		slices.Sort(chans)
		for _, ch := range chans {
			c := n.channels[ch]
			var pc channelSample
			had := false
			if pn != nil && pn.channels[ch] != nil {
				pc, had = *pn.channels[ch], true
			} else if pn != nil {
				had = true // the channel appeared: it started from zero
			}
			bs, count, mark := c.buckets, c.count, "*"
			if had && c.count > pc.count {
				bs, count, mark = deltaBuckets(c.buckets, pc.buckets), c.count-pc.count, ""
			}
			fmt.Fprintf(&b, "%-10s %-8s %12s %12s %10s %10s %10s\n", name, ch,
				byteRate(c.bytesIn, pc.bytesIn, had), byteRate(c.bytesOut, pc.bytesOut, had),
				rate(c.transfers, pc.transfers, had),
				formatSeconds(quantile(0.5, bs, count), mark), formatSeconds(quantile(0.99, bs, count), mark))
		}
	}
	fmt.Fprintf(&b, "\n%-10s %5s %9s %7s %10s %23s %8s %7s %8s\n", "NODE", "PEERS", "MSGS/s", "LEASES", "LENT", "BUDGET USED / LIMIT", "WAITING", "CREDITS", "CACHE HIT")
	for _, name := range names {
		n := cur.nodes[name]
		var pn nodeSample
		had := false
		if prev != nil && prev.nodes[name] != nil {
			pn, had = *prev.nodes[name], true
		}
		hit := "-"
		if n.hasCache && n.cacheHits+n.cacheMisses > 0 {
			hit = fmt.Sprintf("%.1f%%", 100*n.cacheHits/(n.cacheHits+n.cacheMisses))
		}
		fmt.Fprintf(&b, "%-10s %5.0f %9s %7.0f %10s %23s %8.0f %7.0f %8s\n", name, n.peersUp,
			rate(n.msgsSent+n.msgsReceived, pn.msgsSent+pn.msgsReceived, had), n.leases, formatBytes(n.lentBytes),
			formatBytes(n.budgetInUse)+" / "+formatBytes(n.budget), n.waiting, n.credits, hit)
	}
	for _, e := range cur.errors {
		fmt.Fprintf(&b, "\nscrape failed: %s", e)
	}
	b.WriteString("\n")
	return b.String()
}

// formatBytes writes n bytes with a binary unit.
func formatBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", n, units[i])
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// formatSeconds writes a latency with a unit, "-" for NaN, followed by mark.
func formatSeconds(s float64, mark string) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s < 1e-3:
		return fmt.Sprintf("%.0fµs%s", s*1e6, mark)
	case s < 1:
		return fmt.Sprintf("%.1fms%s", s*1e3, mark)
	}
	return fmt.Sprintf("%.2fs%s", s, mark)
}
