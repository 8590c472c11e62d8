package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/internal/progress"
	"github.com/tensorferry/tensorferry/memory"
)

// defaultSizes are the message sizes of a full run.
var defaultSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// modes lists the modes in the order --mode all runs them.
var modes = []string{"peer", "ipc", "staging", "regcache", "contexts", "reuse", "psexchange", "fanout"}

// options are the program's settings.
type options struct {
	sizes    []int
	reps     int // timed repetitions per size and path; 0: by size
	src, dst int // CUDA ordinals of the sending and receiving GPU
	regSize  int // buffer size of the regcache mode
	timeout  time.Duration
	progress io.Writer       // one line per figure as it is known
	nccl     []report.Result // nccl_sendrecv.py's figures, for the summary
	stream   int             // messages per step of the stream path; 0: by size
	// cpuProfile, when set, is where the sending process writes its CPU
	// profile (the receiving one adds ".receiver").
	cpuProfile string
	trace      string // execution traces, like cpuProfile
	logs       bool   // the receiving process logs warnings and errors
	// readSpin is the control connection's read spin in the ipc mode
	// (transport.read_spin; 0: the default, negative: never).
	readSpin time.Duration
	gpus     int   // psexchange: GPUs to use; 0: all
	psSizes  []int // psexchange: parameter bytes
	// receivers is the fanout mode's receiving actors (all on --dst).
	receivers int
	// receiverNodes, when set, puts the fanout mode's receivers in nodes
	// of their own, one process each, on these CUDA ordinals.
	receiverNodes []int
	// relayFanout is flow.relay_fanout of the fanout mode's nodes (0:
	// the default).
	relayFanout int
	// relayWhole adds to the fanout mode a run with relay and whole
	// copies (flow.relay_stream: false) between the streamed one and the
	// one without relay.
	relayWhole bool
	// relayPush adds to the fanout mode, before the others, a run with
	// the defaults: relay pushed by the holder where it shares a GPU with
	// receivers (flow.relay_push); the other runs have relay_push: false.
	relayPush bool
	// copyChunk is ipc.copy_chunk of the fanout mode's nodes (0: the
	// default).
	copyChunk int
	// relayMin is flow.relay_min_bytes of the ipc and fanout modes'
	// nodes (0: the default).
	relayMin int64
}

func main() {
	if isReceiver() {
		runReceiver()
		return
	}
	if isHolder() {
		runHolder()
		return
	}
	if isExchanger() {
		runExchanger()
		return
	}
	mode := flag.String("mode", "all", "peer, ipc, staging, regcache, contexts, reuse, psexchange, fanout or all")
	gpusFlag := flag.Int("gpus", 0, "psexchange: GPUs (one process each; default: all the driver sees)")
	psSizes := flag.String("ps-sizes", "256MiB,1GiB", "psexchange: parameter bytes P of the runs")
	receivers := flag.Int("receivers", 3, "fanout mode: receiving actors of the node on --dst")
	receiverNodes := flag.String("receiver-nodes", "", "fanout mode: CUDA ordinals of receiving nodes, one process each (e.g. 1,1,1 or 1,2,3), instead of --receivers actors of one node")
	copyChunk := flag.String("ipc-copy-chunk", "", "fanout mode: the nodes' ipc.copy_chunk (the pieces of a copy, and of a streamed or pushed relay; default 64MiB)")
	relayPush := flag.Bool("relay-push", true, "fanout mode: also measure relay pushed by the holder (flow.relay_push, the default), before the streamed run without push")
	relayWhole := flag.Bool("relay-whole", true, "fanout mode: also measure relay with whole copies (flow.relay_stream: false), between the streamed run and the run without relay")
	relayFanout := flag.Int("relay-fanout", 0, "fanout mode: the nodes' flow.relay_fanout (1: chains; 0: the config's default)")
	relayMin := flag.String("relay-min", "", "ipc and fanout modes: the nodes' flow.relay_min_bytes (fanout default: the config's; ipc default: relay off, since its stream repeats one tensor)")
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
	stream := flag.Int("stream", 0, "messages in flight per step of the stream path (default: by size, as nccl_sendrecv.py's iterations)")
	cpuProfile := flag.String("cpuprofile", "", "write CPU profiles of the sending process to FILE and of the receiving one to FILE.receiver")
	traceFile := flag.String("trace", "", "write execution traces of the sending process to FILE and of the receiving one to FILE.receiver")
	logs := flag.Bool("log", false, "the receiving process logs its warnings and errors to stderr")
	readSpin := flag.Duration("read-spin", 0, "ipc mode: the control connection's read spin, on TCP and shared memory (transport.read_spin; 0: the node's default; negative: never)")
	showProgress := flag.Bool("progress", false, "print a progress line on stderr even when it is not a terminal")
	flag.Parse()

	o := options{reps: *reps, src: *src, dst: *dst, timeout: *timeout, progress: os.Stderr, stream: *stream, cpuProfile: *cpuProfile, trace: *traceFile, logs: *logs, readSpin: *readSpin, receivers: *receivers}
	if *receivers < 1 || *receivers > 64 {
		fatal(fmt.Errorf("--receivers %d: want 1 to 64", *receivers))
	}
	if o.relayFanout = *relayFanout; o.relayFanout < 0 || o.relayFanout > 64 {
		fatal(fmt.Errorf("--relay-fanout %d: want 0 to 64", o.relayFanout))
	}
	o.relayWhole, o.relayPush = *relayWhole, *relayPush
	if *copyChunk != "" {
		n, err := size.Parse(*copyChunk)
		if err != nil || n < 4<<10 || n > 1<<30 {
			fatal(fmt.Errorf("--ipc-copy-chunk %q: want a size of 4KiB to 1GiB", *copyChunk))
		}
		o.copyChunk = n
	}
	if *receiverNodes != "" {
		for _, f := range strings.Split(*receiverNodes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				fatal(fmt.Errorf("--receiver-nodes %q: want CUDA ordinals separated by commas", *receiverNodes))
			}
			o.receiverNodes = append(o.receiverNodes, n)
		}
		if len(o.receiverNodes) > 64 {
			fatal(fmt.Errorf("--receiver-nodes: %d nodes, want at most 64", len(o.receiverNodes)))
		}
	}
	if *relayMin != "" {
		n, err := size.Parse(*relayMin)
		if err != nil || n < 1 {
			fatal(fmt.Errorf("--relay-min %q: want a size of at least 1 byte", *relayMin))
		}
		o.relayMin = int64(n)
	}
	if *quick && o.reps == 0 {
		o.reps = 3
	}
	var err error
	if o.sizes, err = sizes(*minSize, *maxSize); err == nil {
		o.regSize, err = size.Parse(*regSize)
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
	if err == nil {
		o.gpus = *gpusFlag
		o.psSizes, err = parseSizes(*psSizes)
	}
	if err == nil && *nccl != "" {
		o.nccl, err = readResults(*nccl)
	}
	if err != nil {
		fatal(err)
	}
	if o.cpuProfile != "" {
		stop, err := report.StartCPUProfile(o.cpuProfile)
		if err != nil {
			fatal(err)
		}
		defer stop()
	}
	if o.trace != "" {
		stop, err := report.StartTrace(o.trace)
		if err != nil {
			fatal(err)
		}
		defer stop()
	}

	gpus, why := gpuCount()
	if gpus == 0 {
		fmt.Printf("gpu: skipped: %s\n", why)
		return
	}
	fmt.Fprintf(os.Stderr, "gpu: %d GPUs, %d CPUs, modes %s\n", gpus, runtime.NumCPU(), strings.Join(run, ","))
	var rs []report.Result
	var errs []error
	prog := progress.New(os.Stderr, *showProgress)
	o.progress = prog.Writer(o.progress)
	for i, m := range run {
		if reason := needs(m, gpus, o); reason != "" {
			fmt.Printf("gpu: %s: skipped: %s\n", m, reason)
			continue
		}
		prog.Phase(i+1, len(run), "gpu: mode "+m, 0)
		got, err := runMode(m, fitDevices(m, gpus, o))
		rs = append(rs, got...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
		}
	}
	prog.Close()
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
	pprof.StopCPUProfile() // flushes a profile in progress
	fmt.Fprintf(os.Stderr, "gpu: %v\n", err)
	os.Exit(1)
}

// sizes returns the default sizes between lo and hi.
func sizes(lo, hi string) ([]int, error) {
	a, err := size.Parse(lo)
	if err != nil {
		return nil, err
	}
	b, err := size.Parse(hi)
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
		parts = append(parts, size.Format(s))
	}
	return strings.Join(parts, ", ")
}

// gpuCount returns the number of CUDA devices, or 0 and the driver's
// reason.
func gpuCount() (int, string) {
	n, err := memory.CUDADeviceCount()
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
	case "peer":
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

// fitDevices makes the modes that run on one GPU (staging, regcache, and
// ipc with both processes on it) use --src as the receiver too on a host
// whose --dst does not exist.
func fitDevices(m string, gpus int, o options) options {
	if (m == "staging" || m == "regcache" || m == "ipc" || m == "contexts" || m == "fanout") && (o.dst < 0 || o.dst >= gpus) {
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
	case "contexts":
		return runContexts(o)
	case "reuse":
		return runReuse(o)
	case "psexchange":
		return runExchange(o)
	case "fanout":
		return runFanout(o)
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
	o.progressf("  %s %s %s = %s %s", r.Path, size.Format(int(r.Size)), r.Metric, report.FormatValue(r.Value), r.Channel)
	return r
}
