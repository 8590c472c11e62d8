// Command gpu measures GPU tensors moving between GPUs and processes on one
// host, side by side with the baselines of issue 4, sizes 4 KiB … 1 GiB.
// It runs on the GPU machine; elsewhere it prints why it skipped and exits 0.
//
//	gpu --mode all --out $OUT          # everything; JSON lines in $OUT/gpu.jsonl
//	gpu --mode peer                    # cuMemcpyPeer GPU0 → GPU1, one process: the ceiling
//	gpu --mode ipc                     # actor messages GPU0 → GPU1 between two processes
//	gpu --mode staging                 # GPU → TCP loopback → GPU vs raw TCP vs the naive sequence
//	gpu --mode regcache                # first vs repeated transfer of one buffer
//	gpu --mode peer --max 256MiB --reps 20 --json
//	gpu --mode ipc --nccl nccl.txt     # also states the NCCL target from nccl_sendrecv.py's output
//
// Modes and their paths (the "path" of each JSON line):
//
//   - peer: cuMemcpyPeer — cuMemcpyPeerAsync from a cuda:0 allocation to a
//     cuda:1 one with peer access enabled, timed with events around a batch
//     of copies (as many as make 64 MiB, 1 to 100), per copy, median of the
//     batches.
//   - ipc: tensorferry-ipc — two processes (this program re-executes itself
//     as the receiver): node0 owns a tensor on cuda:0 and sends &Msg{T: t}
//     with RequestFuture to an actor of node1 whose tensors live on cuda:1;
//     node1 fetches the tensor through whatever channel the two nodes select
//     (ipc when it runs and NVML reports P2P) and delivers the message; the
//     actor answers an Ack. Time: RequestFuture until the Ack. The channel
//     that carried the bytes is in each line's "channel" (node.Stats).
//   - staging: tensorferry-staging-gpu — the same with ipc and verbs
//     disabled in the config, so bytes go GPU → pinned ring → TCP loopback →
//     pinned ring → GPU; raw-tcp — one loopback connection moving the same
//     bytes from host memory into a host buffer the receiver keeps; naive —
//     in this process, cuMemcpyDtoH into pageable memory, the bytes over
//     the raw TCP connection, cuMemcpyHtoD on the receiving side, one after
//     the other.
//   - regcache: tensorferry-staging-gpu first_ms and repeat_ms — the first
//     transfer of a tensor on fresh nodes (it dials the data connection and
//     allocates the pinned rings) and the median of the following ones;
//     regcache-h2d — a pageable host buffer registered through
//     memory.RegCache and a HostRegistrar, then copied to cuda:0 with
//     cuMemcpyHtoDAsync: the first copy (miss: cuMemHostRegister paid),
//     repeated copies (hits), the registration alone, the same copy from an
//     unregistered buffer (pageable_ms), and the cache's hit and miss
//     counters.
//
// Figures: gbps is bytes / median time in GB/s (10^9 bytes per second), us
// the median time of one transfer; the actor paths also report fetch_gbps,
// the bytes over the median time the receiving node spent in the channel's
// Fetch. The NCCL baseline is ../shared/peers/nccl_sendrecv.py, run in the
// same session; benchmarks/plot reads its output and this program's.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/internal/cuda"
)

// defaultSizes are the message sizes of a full run.
var defaultSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// modes lists the modes in the order --mode all runs them.
var modes = []string{"peer", "ipc", "staging", "regcache"}

// options are the program's settings.
type options struct {
	sizes    []int
	reps     int // timed repetitions per size and path; 0: by size
	src, dst int // CUDA ordinals of the sending and receiving GPU
	regSize  int // buffer size of the regcache mode
	timeout  time.Duration
	progress io.Writer       // one line per figure as it is known
	nccl     []report.Result // nccl_sendrecv.py's figures, for the summary
}

func main() {
	if isReceiver() {
		runReceiver()
		return
	}
	mode := flag.String("mode", "all", "peer, ipc, staging, regcache or all")
	minSize := flag.String("min", "4KiB", "smallest message size")
	maxSize := flag.String("max", "1GiB", "largest message size")
	reps := flag.Int("reps", 0, "timed repetitions per size and path (default: by size, 5 at 1 GiB to 200 at 4 KiB)")
	src := flag.Int("src", 0, "CUDA ordinal of the sending GPU")
	dst := flag.Int("dst", 1, "CUDA ordinal of the receiving GPU (staging and regcache fall back to --src on a one-GPU host)")
	regSize := flag.String("regcache-size", "256MiB", "buffer size of the regcache mode")
	asJSON := flag.Bool("json", false, "print JSON lines instead of the table")
	out := flag.String("out", "", "also write the JSON lines to DIR/gpu.jsonl")
	quick := flag.Bool("quick", false, "stop at 64 MiB, 3 repetitions")
	timeout := flag.Duration("timeout", 2*time.Minute, "deadline of one message")
	nccl := flag.String("nccl", "", "output of nccl_sendrecv.py, to state the NCCL target in the summary")
	flag.Parse()

	o := options{reps: *reps, src: *src, dst: *dst, timeout: *timeout, progress: os.Stderr}
	if *quick && o.reps == 0 {
		o.reps = 3
	}
	var err error
	if o.sizes, err = sizes(*minSize, *maxSize); err == nil {
		o.regSize, err = cluster.ParseSize(*regSize)
	}
	if *quick {
		o.sizes = slices.DeleteFunc(o.sizes, func(s int) bool { return s > 64<<20 })
		if err == nil && len(o.sizes) == 0 {
			err = errors.New("--quick stops at 64MiB, below --min")
		}
	}
	run := modes
	if *mode != "all" {
		run = strings.Split(*mode, ",")
		for _, m := range run {
			if !slices.Contains(modes, m) {
				err = errors.Join(err, fmt.Errorf("unknown mode %q: want %s or all", m, strings.Join(modes, ", ")))
			}
		}
	}
	if err == nil && *nccl != "" {
		o.nccl, err = readResults(*nccl)
	}
	if err != nil {
		fatal(err)
	}

	gpus, why := gpuCount()
	if gpus == 0 {
		fmt.Printf("gpu: skipped: %s\n", why)
		return
	}
	fmt.Fprintf(os.Stderr, "gpu: %d GPUs, %d CPUs, modes %s\n", gpus, runtime.NumCPU(), strings.Join(run, ","))
	var rs []report.Result
	var errs []error
	for _, m := range run {
		if reason := needs(m, gpus, o); reason != "" {
			fmt.Printf("gpu: %s: skipped: %s\n", m, reason)
			continue
		}
		got, err := runMode(m, fitDevices(m, gpus, o))
		rs = append(rs, got...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
		}
	}
	if *asJSON {
		errs = append(errs, report.WriteJSON(os.Stdout, rs))
	} else {
		errs = append(errs, report.WriteTable(os.Stdout, rs))
		for _, line := range summary(rs, o.nccl) {
			fmt.Println(line)
		}
	}
	if *out != "" {
		errs = append(errs, writeJSONFile(filepath.Join(*out, "gpu.jsonl"), rs))
	}
	if err := errors.Join(errs...); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "gpu: %v\n", err)
	os.Exit(1)
}

// sizes returns the default sizes between lo and hi.
func sizes(lo, hi string) ([]int, error) {
	a, err := cluster.ParseSize(lo)
	if err != nil {
		return nil, err
	}
	b, err := cluster.ParseSize(hi)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, s := range defaultSizes {
		if s >= a && s <= b {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no size between %s and %s (sizes are %s)", lo, hi, formatSizes(defaultSizes))
	}
	return out, nil
}

func formatSizes(ss []int) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, cluster.FormatSize(s))
	}
	return strings.Join(parts, ", ")
}

// gpuCount returns the number of CUDA devices, or 0 and the driver's
// reason.
func gpuCount() (int, string) {
	if err := cuda.Init(); err != nil {
		return 0, err.Error()
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, err.Error()
	}
	if n == 0 {
		return 0, "the CUDA driver sees no GPU"
	}
	return n, ""
}

// needs returns why mode m cannot run with gpus GPUs, or "".
func needs(m string, gpus int, o options) string {
	switch m {
	case "peer", "ipc":
		if gpus < 2 {
			return fmt.Sprintf("needs 2 GPUs, the driver sees %d", gpus)
		}
		if o.src == o.dst || max(o.src, o.dst) >= gpus || min(o.src, o.dst) < 0 {
			return fmt.Sprintf("--src %d and --dst %d must be two different GPUs of %d", o.src, o.dst, gpus)
		}
	default:
		if o.src < 0 || o.src >= gpus {
			return fmt.Sprintf("--src %d: the driver sees %d GPUs", o.src, gpus)
		}
	}
	return ""
}

// fitDevices makes the one-GPU modes use --src as the receiver too on a
// host whose --dst does not exist.
func fitDevices(m string, gpus int, o options) options {
	if (m == "staging" || m == "regcache") && (o.dst < 0 || o.dst >= gpus) {
		o.dst = o.src
	}
	return o
}

// runMode runs one mode.
func runMode(m string, o options) ([]report.Result, error) {
	switch m {
	case "peer":
		return runPeer(o)
	case "ipc":
		return runIPC(o)
	case "staging":
		return runStaging(o)
	case "regcache":
		return runRegCache(o)
	}
	return nil, fmt.Errorf("unknown mode %q", m)
}

// readResults reads a file of JSON lines.
func readResults(path string) ([]report.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return report.Read(f)
}

// writeJSONFile writes rs as JSON lines to path, creating its directory.
func writeJSONFile(path string, rs []report.Result) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := report.WriteJSON(f, rs); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// repsFor returns the timed repetitions at size: about 2 GiB per path,
// between 5 and 200, unless o fixes the count.
func repsFor(o options, size int) int {
	if o.reps > 0 {
		return o.reps
	}
	return min(200, max(5, (2<<30)/size))
}

// progressf writes one progress line.
func (o options) progressf(format string, args ...any) {
	if o.progress != nil {
		fmt.Fprintf(o.progress, format+"\n", args...)
	}
}

// emit hands r to the progress writer and returns it.
func (o options) emit(r report.Result) report.Result {
	o.progressf("  %s %s %s = %s %s", r.Path, cluster.FormatSize(int(r.Size)), r.Metric, report.FormatValue(r.Value), r.Channel)
	return r
}
