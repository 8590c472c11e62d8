package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/internal/progress"
	"github.com/tensorferry/tensorferry/memory"
)

// Path names, as they appear in the report.
const (
	pathRaw = "raw-tcp"
	// pathRawFresh is raw-tcp with a new receive buffer for every message,
	// as tensorferry allocates every destination: it separates the cost of
	// that allocation from the rest.
	pathRawFresh = "raw-tcp-fresh-buffer"
	// Round-trip figures of the tensorferry nodes.
	pathRTT64  = "tensorferry-64B-msg"
	pathRTT4K  = "tensorferry-4KiB-tensor"
	rttTensor  = 4 << 10
	rttPayload = 64
)

// pathTF is the tensorferry path, named after the data channel it is forced
// to use (--channel).
var pathTF = "tensorferry-staging"

// allPaths are the paths --paths may name; "rtt" stands for both round-trip
// figures.
var allPaths = []string{pathRaw, pathRawFresh, pathTF, "rtt"}

// defaultSizes are the message sizes of a full run.
var defaultSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// options are the program's settings.
type options struct {
	sizes    []int
	reps     int // timed repetitions per size and path; 0: by size
	rttCount int
	paths    []string
	chunk    int // staging chunk size; 0: the config's default
	inflight int // staging chunks in flight; 0: the config's default
	timeout  time.Duration
	// verbsSrc and verbsDst are the devices of the verbs pair paths' source
	// tensor and destination (--src, --dst).
	verbsSrc, verbsDst memory.Device
	// nic is the RDMA device of verbs-1-nic (--nic; "": the first usable).
	nic string
	// skipVerbs, when set, is told about a verbs pair path that cannot run
	// here (too few RDMA devices), which is then left out; nil fails.
	skipVerbs func(path string, err error)
}

func main() {
	minSize := flag.String("min", "4KiB", "smallest message size")
	maxSize := flag.String("max", "1GiB", "largest message size")
	reps := flag.Int("reps", 0, "timed repetitions per size and path (default: by size, 5 at 1 GiB to 200 at 4 KiB)")
	rtt := flag.Int("rtt-count", 5000, "timed round trips per RTT figure")
	quick := flag.Bool("quick", false, "stop at 64 MiB, fewer repetitions and round trips")
	asJSON := flag.Bool("json", false, "print one JSON object per figure per line instead of the table")
	only := flag.String("paths", "", "comma-separated paths to measure: "+strings.Join(allPaths, ",")+
		" (with --channel verbs also "+pathVerbs1+" and "+pathVerbs2+"; default: all)")
	chunk := flag.String("chunk", "", "staging chunk size (default: the config's, 4MiB)")
	inflight := flag.Int("inflight", 0, "staging chunks in flight per transfer (default: the config's, 4)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	timeout := flag.Duration("timeout", 2*time.Minute, "deadline of one message")
	nic := flag.String("nic", "", "RDMA device of verbs-1-nic, as ib_read_bw -d names it (default: the first usable)")
	src := flag.String("src", "cpu", "device of the verbs pair paths' source tensor (cpu, cuda:N)")
	dst := flag.String("dst", "cpu", "device of the verbs pair paths' destination (cpu, cuda:N)")
	channel := flag.String("channel", "staging", "data channel the tensorferry nodes must use: staging or verbs (the others are disabled)")
	showProgress := flag.Bool("progress", false, "print a progress line on stderr even when it is not a terminal")
	flag.Parse()
	if *channel != "staging" && *channel != "verbs" {
		fmt.Fprintf(os.Stderr, "transfer: --channel %q: want staging or verbs\n", *channel)
		os.Exit(2)
	}
	pathTF = "tensorferry-" + *channel
	allPaths[2] = pathTF
	forcedChannel = *channel
	if *channel == "verbs" {
		allPaths = append(allPaths, pathVerbs1, pathVerbs2)
	}

	o := options{reps: *reps, rttCount: *rtt, inflight: *inflight, timeout: *timeout, nic: *nic}
	if *only == "" {
		// Paths by default: one the host cannot run is left out, said so.
		o.skipVerbs = func(path string, err error) {
			fmt.Fprintf(os.Stderr, "transfer: %s left out: %v\n", path, err)
		}
	}
	lo, err := size.Parse(*minSize)
	if err == nil {
		var hi int
		if hi, err = size.Parse(*maxSize); err == nil {
			if *quick && hi > 64<<20 {
				hi = 64 << 20
			}
			for _, s := range defaultSizes {
				if s >= lo && s <= hi {
					o.sizes = append(o.sizes, s)
				}
			}
		}
	}
	if err == nil && *chunk != "" {
		o.chunk, err = size.Parse(*chunk)
	}
	if err == nil {
		o.verbsSrc, err = memory.ParseDevice(*src)
	}
	if err == nil {
		o.verbsDst, err = memory.ParseDevice(*dst)
	}
	if err != nil {
		fatal(err)
	}
	if *quick {
		o.rttCount = max(1, o.rttCount/10)
		if o.reps == 0 {
			o.reps = 3
		}
	}
	o.paths = allPaths
	if *only != "" {
		o.paths = strings.Split(*only, ",")
		for _, p := range o.paths {
			if !slices.Contains(allPaths, p) {
				fatal(fmt.Errorf("unknown path %q in --paths", p))
			}
		}
	}

	if *cpuprofile != "" {
		stop, err := report.StartCPUProfile(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		defer stop()
	}

	fmt.Fprintf(os.Stderr, "transfer: %d CPUs, GOMAXPROCS %d, load average %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), loadAverage())
	prog := progress.New(os.Stderr, *showProgress)
	prog.Phase(0, 0, fmt.Sprintf("transfer: %d sizes, paths %s: figures", len(o.sizes), strings.Join(o.paths, ",")), 0)
	rs, err := run(o, func(r report.Result) {
		prog.Add(1)
		if !*asJSON {
			fmt.Fprintf(prog.Writer(os.Stderr), "  %s %s %s = %s\n", r.Path, size.Format(int(r.Size)), r.Metric, report.FormatValue(r.Value))
		}
	})
	prog.Close()
	if *asJSON {
		err = errors.Join(err, report.WriteJSON(os.Stdout, rs))
	} else {
		err = errors.Join(err, report.WriteTable(os.Stdout, rs))
		for _, line := range summary(rs) {
			fmt.Println(line)
		}
	}
	fmt.Fprintf(os.Stderr, "transfer: load average after the run %s\n", loadAverage())
	if err != nil {
		pprof.StopCPUProfile()
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "transfer: %v\n", err)
	os.Exit(1)
}

// loadAverage returns the 1, 5 and 15 minute load averages of the host, or
// "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// summary states the targets against the figures in rs.
func summary(rs []report.Result) []string {
	find := func(path string, size int64, metric string) (float64, bool) {
		for _, r := range rs {
			if r.Path == path && r.Size == size && r.Metric == metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	var out []string
	for _, s := range defaultSizes {
		if s < 64<<20 {
			continue
		}
		tf, ok1 := find(pathTF, int64(s), report.GBps)
		raw, ok2 := find(pathRaw, int64(s), report.GBps)
		tfBest, _ := find(pathTF, int64(s), metricBest)
		rawBest, _ := find(pathRaw, int64(s), metricBest)
		if ok1 && ok2 && raw > 0 && rawBest > 0 {
			out = append(out, fmt.Sprintf("%s: tensorferry %.1f %% of raw TCP (target ≥ 85 %%); best repetitions: %.1f %%",
				size.Format(s), 100*tf/raw, 100*tfBest/rawBest))
		}
	}
	a, ok1 := find(pathRTT4K, rttTensor, report.RTTP50Us)
	b, ok2 := find(pathRTT64, rttPayload, report.RTTP50Us)
	if ok1 && ok2 && b > 0 {
		out = append(out, fmt.Sprintf("4KiB tensor round trip p50 = %.2f× the 64-byte message round trip (target ≤ 2×)", a/b))
	}
	return out
}
