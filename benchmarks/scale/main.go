package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/config"
)

// Modes, as they appear in the report.
const (
	modeMesh   = "mesh"
	modeGossip = "gossip"
	// modeGossipOnly is package cluster/gossip alone, without the
	// cluster around it.
	modeGossipOnly = "gossip-only"
)

// cut is what the measurement needs of a cluster under test.
type cut interface {
	name(i int) string
	// traffic returns the messages and bytes all nodes sent so far.
	traffic() (msgs, bytes uint64)
	downLog() *downLog
	freezeNode(i int) // i is the last node
	kill(i int)
	close()
}

// options are the program's settings.
type options struct {
	sizes    []int
	modes    []string
	idle     time.Duration // the idle period measured
	settle   time.Duration // wait after convergence before measuring
	converge time.Duration // bound on starting and converging
	joinRate float64       // gossip joins per second
	cfg      *config.Config
}

// row is the figures of one mode at one N.
type row struct {
	Mode    string `json:"mode"`
	N       int    `json:"n"`
	Skipped string `json:"skipped,omitempty"`
	// Load1 is the machine's load average (1 minute) when the idle period
	// began: other work on the machine competes for its cores.
	Load1 float64 `json:"load1"`
	// SetupS is the time to start the nodes and converge, in seconds.
	SetupS float64 `json:"setup_s"`
	// FDsPerNode is open descriptors (sockets) per node.
	FDsPerNode float64 `json:"fds_per_node"`
	// GoroutinesPerNode is goroutines per node.
	GoroutinesPerNode float64 `json:"goroutines_per_node"`
	// HeapKiBPerNode is live heap per node, KiB.
	HeapKiBPerNode float64 `json:"heap_kib_per_node"`
	// CPUPctPerNode is CPU time per node while idle, % of one core.
	CPUPctPerNode float64 `json:"cpu_pct_per_node"`
	// MsgsPerNodeS and BytesPerNodeS are what a node sends per second
	// while idle: messages on the wire (socket writes for the mesh, UDP
	// packets and TCP streams for gossip) and their bytes.
	MsgsPerNodeS  float64 `json:"msgs_per_node_s"`
	BytesPerNodeS float64 `json:"bytes_per_node_s"`
	// FalseDowns counts nodes reported down that were not stopped, from
	// the idle period on (by nodes other than the stopped ones).
	FalseDowns int `json:"false_downs"`
	// SetupDowns counts nodes reported down while the cluster was
	// starting and settling.
	SetupDowns int `json:"setup_downs"`
	// Freeze* and Kill* are the delays until the other nodes reported a
	// frozen (resp. killed) node down, seconds: median and last; Missed
	// counts those that did not within the timeout.
	FreezeMedianS float64 `json:"freeze_median_s"`
	FreezeMaxS    float64 `json:"freeze_max_s"`
	FreezeMissed  int     `json:"freeze_missed"`
	KillMedianS   float64 `json:"kill_median_s"`
	KillMaxS      float64 `json:"kill_max_s"`
	KillMissed    int     `json:"kill_missed"`
}

func main() { os.Exit(mainCode()) }

// mainCode runs the program and returns its exit code (deferred calls run
// first).
func mainCode() int {
	sizes := flag.String("n", "16,64,128,256,512", "comma-separated cluster sizes (at least 4)")
	modes := flag.String("modes", modeMesh+","+modeGossip, "comma-separated designs to measure")
	idle := flag.Duration("idle", 15*time.Second, "idle period measured per size and design")
	settle := flag.Duration("settle", 3*time.Second, "wait after convergence before the idle period")
	converge := flag.Duration("converge", 3*time.Minute, "bound on starting and converging one cluster")
	joinRate := flag.Float64("join-rate", 10, "gossip nodes started and joined per second (each join is news gossiped to every member: all nodes share this machine's cores)")
	asJSON := flag.Bool("json", false, "print one JSON object per size and design instead of the table")
	jsonl := flag.String("jsonl", "", "also write the JSON objects to this file")
	svg := flag.String("svg", "", "also draw bench-scale-*.svg into this directory")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	from := flag.String("from", "", "measure nothing: print and draw the rows of this file (as -jsonl wrote it)")
	flag.Parse()
	if *cpuprofile != "" {
		stop, err := report.StartCPUProfile(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			return 1
		}
		defer stop()
	}
	o := options{idle: *idle, settle: *settle, converge: *converge, joinRate: *joinRate}
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 4 {
			fmt.Fprintf(os.Stderr, "scale: bad size %q: want an integer ≥ 4\n", f)
			return 2
		}
		o.sizes = append(o.sizes, n)
	}
	o.modes = strings.Split(*modes, ",")
	for _, m := range o.modes {
		if m != modeMesh && m != modeGossip && m != modeGossipOnly {
			fmt.Fprintf(os.Stderr, "scale: unknown mode %q\n", m)
			return 2
		}
	}
	cfg, err := defaultTimings()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	o.cfg = cfg
	limit, err := raiseFDLimit()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale: descriptor limit:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "scale: descriptor limit %d, GOMAXPROCS %d, heartbeat %v, failure_timeout %v, gossip %+v\n",
		limit, runtime.GOMAXPROCS(0), cfg.HeartbeatInterval, cfg.FailureTimeout, cfg.Gossip)
	var rows []row
	if *from != "" {
		rows, err = readRows(*from)
	} else {
		rows, err = run(o, limit, func(r row) { fmt.Fprintf(os.Stderr, "scale: %+v\n", r) })
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	if *jsonl != "" {
		f, ferr := os.Create(*jsonl)
		if ferr != nil {
			fmt.Fprintln(os.Stderr, "scale:", ferr)
			return 1
		}
		err = errors.Join(writeJSON(f, rows), f.Close())
	}
	switch {
	case err != nil:
	case *asJSON:
		err = writeJSON(os.Stdout, rows)
	default:
		err = writeTable(os.Stdout, rows, cfg)
	}
	if err == nil && *svg != "" {
		err = drawAll(*svg, rows, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	return 0
}

// defaultTimings returns a validated config with the default liveness and
// gossip timings and a random secret.
func defaultTimings() (*config.Config, error) {
	cfg, err := config.LocalConfig("scale", 1)
	if err != nil {
		return nil, err
	}
	d := config.DefaultConfig()
	cfg.HeartbeatInterval, cfg.FailureTimeout, cfg.DialTimeout = d.HeartbeatInterval, d.FailureTimeout, d.DialTimeout
	cfg.ReconnectMin, cfg.ReconnectMax = d.ReconnectMin, d.ReconnectMax
	cfg.Gossip = config.GossipConfig{} // derived again from failure_timeout
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// meshFits reports whether a mesh of n fits in limit descriptors, with
// used already open: n×(n−1) connection ends, twice that while both ends
// of a pair dial each other at start, 2n listeners, some spare.
func meshFits(n int, limit uint64, used int) bool {
	return uint64(2*n*(n-1)+2*n+used+256) <= limit
}

// baseGoroutines is the goroutines of the process before any cluster.
var baseGoroutines = runtime.NumGoroutine()

// quiesce waits, up to a bound, for the goroutines of the clusters measured
// before to end (memberlist's loops end on their own after Shutdown), so
// that what they hold is not counted as the baseline of the next.
func quiesce() {
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > baseGoroutines+8 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// meshMax is the largest mesh that fits.
func meshMax(limit uint64, used int) int {
	n := 4
	for meshFits(n+1, limit, used) {
		n++
	}
	return n
}

// run measures every mode at every size, calling progress with each row.
func run(o options, limit uint64, progress func(row)) ([]row, error) {
	var rows []row
	meshMaxRun := false
	for _, n := range o.sizes {
		for _, mode := range o.modes {
			var r row
			if mode == modeMesh && !meshFits(n, limit, openFDs()) {
				// The largest mesh that fits, once, before the first that
				// does not.
				if max := meshMax(limit, openFDs()); !meshMaxRun && max >= 4 && !slices.Contains(o.sizes, max) {
					meshMaxRun = true
					r, err := measure(o, mode, max)
					if err != nil {
						r = row{Mode: mode, N: max, Skipped: err.Error()}
					}
					progress(r)
					rows = append(rows, r)
				}
				r = row{Mode: mode, N: n, Skipped: fmt.Sprintf("needs %d descriptors in one process, limit %d", n*(n-1)+2*n, limit)}
			} else {
				var err error
				if r, err = measure(o, mode, n); err != nil {
					// Too large for this machine: said in the report, and
					// the other sizes still run.
					r = row{Mode: mode, N: n, Skipped: err.Error()}
				}
			}
			progress(r)
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// measure runs one mode at one size.
func measure(o options, mode string, n int) (row, error) {
	r := row{Mode: mode, N: n}
	quiesce()
	fd0, g0, h0 := openFDs(), runtime.NumGoroutine(), heapAlloc()
	start := time.Now()
	var (
		c   cut
		err error
	)
	switch mode {
	case modeMesh:
		c, err = startMesh(n, o.cfg, o.converge)
	case modeGossip:
		c, err = startClusterGossip(n, o.cfg, o.converge, o.joinRate)
	default:
		c, err = startGossip(n, o.cfg, o.converge, o.joinRate)
	}
	if err != nil {
		return r, err
	}
	closed := false
	defer func() {
		if !closed {
			c.close()
		}
	}()
	r.SetupS = time.Since(start).Seconds()
	time.Sleep(o.settle)
	r.FDsPerNode = float64(openFDs()-fd0) / float64(n)
	r.GoroutinesPerNode = float64(runtime.NumGoroutine()-g0) / float64(n)
	r.HeapKiBPerNode = float64(int64(heapAlloc())-int64(h0)) / 1024 / float64(n)

	downs := c.downLog()
	r.SetupDowns = downs.count()
	r.Load1 = loadAvg()
	idleStart := time.Now()
	m0, b0 := c.traffic()
	cpu0, t0 := cpuTime(), time.Now()
	time.Sleep(o.idle)
	m1, b1 := c.traffic()
	el := time.Since(t0)
	cpu := cpuTime() - cpu0
	per := float64(n) * el.Seconds()
	r.MsgsPerNodeS = float64(m1-m0) / per
	r.BytesPerNodeS = float64(b1-b0) / per
	r.CPUPctPerNode = 100 * cpu.Seconds() / per

	// A frozen node: the last one.
	timeout := 4*o.cfg.FailureTimeout + 10*time.Second
	frozen, killed := n-1, n-2
	all := make([]int, 0, n)
	for i := range n - 2 {
		all = append(all, i)
	}
	since := time.Now()
	c.freezeNode(frozen)
	ds, missed := downs.wait(c.name(frozen), all, since, timeout)
	d := summarise(ds, missed)
	r.FreezeMedianS, r.FreezeMaxS, r.FreezeMissed = d.median.Seconds(), d.max.Seconds(), d.missing

	since = time.Now()
	c.kill(killed)
	ds, missed = downs.wait(c.name(killed), all, since, timeout)
	d = summarise(ds, missed)
	r.KillMedianS, r.KillMaxS, r.KillMissed = d.median.Seconds(), d.max.Seconds(), d.missing

	// False downs: any node reported down by a live node other than the
	// two stopped on purpose, from convergence on.
	victims := []string{c.name(frozen), c.name(killed)}
	downs.mu.Lock()
	for _, rec := range downs.recs {
		if !rec.at.Before(idleStart) && rec.reporter != frozen && rec.reporter != killed && !slices.Contains(victims, rec.victim) {
			r.FalseDowns++
		}
	}
	downs.mu.Unlock()

	c.close()
	closed = true
	// What the cluster held is garbage once its timers (probes,
	// suspicions, idle connections) have fired: wait for them, so that
	// the next cluster's baseline does not hold it.
	time.Sleep(2*o.cfg.FailureTimeout + 2*time.Second)
	return r, nil
}

// readRows reads the rows -jsonl wrote.
func readRows(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []row
	dec := json.NewDecoder(f)
	for {
		var r row
		if err := dec.Decode(&r); err == io.EOF {
			return rows, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, r)
	}
}

func writeJSON(w io.Writer, rows []row) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// writeTable writes rows as a markdown table.
func writeTable(w io.Writer, rows []row, cfg *config.Config) error {
	var b strings.Builder
	fmt.Fprintf(&b, "heartbeat %v, failure_timeout %v; gossip probe %v, suspicion ×%d, gossip interval %v: detection target %v\n\n",
		cfg.HeartbeatInterval, cfg.FailureTimeout, cfg.Gossip.ProbeInterval, cfg.Gossip.SuspicionMult, cfg.Gossip.GossipInterval,
		cfg.FailureTimeout+cfg.Gossip.GossipInterval)
	b.WriteString("| design | N | load | setup | fds/node | goroutines/node | heap/node | CPU/node (idle) | msgs/node/s | bytes/node/s | false downs (setup) | frozen: detected median / all | killed: detected median / all |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(&b, "| %s | %d | | not run: %s |||||||||| |\n", r.Mode, r.N, strings.Join(strings.Fields(r.Skipped), " "))
			continue
		}
		heap := fmt.Sprintf("%.0f KiB", r.HeapKiBPerNode)
		if r.HeapKiBPerNode <= 0 {
			heap = "n/a" // an earlier cluster's memory was freed meanwhile
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1fs | %.1f | %.1f | %s | %.2f%% | %.1f | %.0f | %d (%d) | %s | %s |\n",
			r.Mode, r.N, r.Load1, r.SetupS, r.FDsPerNode, r.GoroutinesPerNode, heap, r.CPUPctPerNode,
			r.MsgsPerNodeS, r.BytesPerNodeS, r.FalseDowns, r.SetupDowns,
			detectionCell(r.FreezeMedianS, r.FreezeMaxS, r.FreezeMissed), detectionCell(r.KillMedianS, r.KillMaxS, r.KillMissed))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func detectionCell(med, max float64, missed int) string {
	if med == 0 && missed > 0 {
		return fmt.Sprintf("none (%d missed)", missed)
	}
	s := fmt.Sprintf("%.2fs / %.2fs", med, max)
	if missed > 0 {
		s += fmt.Sprintf(" (%d missed)", missed)
	}
	return s
}

var errNoRows = errors.New("no figures to draw")
