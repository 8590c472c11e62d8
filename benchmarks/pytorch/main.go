// Command pytorch measures one tensor moving between a Go node and a
// PyTorch process (python/tensorferry) on one host, both ways, beside the
// same call between two Go processes, sizes 4 KiB … 1 GiB.
//
//	pytorch                              # on cuda:0 when there is a GPU, else on the CPU
//	pytorch --out $OUT                   # also $OUT/pytorch.jsonl and $OUT/pytorch.csv
//	pytorch --device cpu --max 1MiB      # through staging and inline, on any machine
//	pytorch --python /usr/bin/python3 --reps 20 --json
//	pytorch --peer-gpu 1                 # the receiving Go node and the Python node on cuda:1
//	pytorch --python-inline=false        # the Python sink on the dispatch thread (one hand-off more)
//	pytorch --go-shm=false               # Go <-> Go control frames over TCP too, as Go <-> Python's go
//
// It starts three nodes of one cluster on loopback: node0 here, node1 a
// Python node (peer.py beside this source, run with --python), node2 this
// program re-executed as a Go node. Each node has an actor "sink" that
// answers a message holding one tensor with an Ack naming the channel
// that carried it. Paths (the "path" of each JSON line), one message at a
// time, alternating per size:
//
//   - go-go: node0 sends node2 a tensor of the size on --device with
//     Node.Request; time: the request until the Ack (the baseline).
//   - go-python: the same call from node0 to node1.
//   - python-go: node1 sends node0 a torch tensor of the size on its
//     device with Node.request, timed in Python the same way.
//
// Figures: us, the median time of one message; gbps, bytes over that
// median (10^9 bytes per second); each line's channel is the one the
// receiver reported (ipc between GPUs of one host; staging or inline on
// the CPU). The summary states issue 33's targets: at ≥ 16 MiB the
// Python paths reach ≥ 90 % of go-go's bandwidth; at ≤ 1 MiB one message
// takes ≤ 1.5× go-go's time.
package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma/ipc"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// Msg carries the tensor; Ack answers it with the channel that moved it.
type Msg struct{ T *tensor.Tensor }

// Ack answers Msg.
type Ack struct{ Via string }

func init() {
	actor.MustRegisterMessage("bench.Msg", &Msg{})
	actor.MustRegisterMessage("bench.Ack", &Ack{})
}

// childEnv holds the child's spec: it is the Go node node2.
const childEnv = "BENCH_PYTORCH_CHILD"

type childSpec struct {
	Config string `json:"config"`
	Node   string `json:"node"`
}

func main() {
	if os.Getenv(childEnv) != "" {
		if err := child(); err != nil {
			fmt.Fprintf(os.Stderr, "pytorch: child: %v\n", err)
			os.Exit(1)
		}
		return
	}
	minSize := flag.String("min", "4KiB", "smallest tensor")
	maxSize := flag.String("max", "1GiB", "largest tensor")
	reps := flag.Int("reps", 0, "timed messages per size and path (default: by size, 200 at 4 KiB to 5 at 1 GiB)")
	dev := flag.String("device", "auto", "auto (cuda:0 when CUDA and the ipc channel are there), cpu or cuda")
	py := flag.String("python", "python3", "Python with torch")
	peer := flag.String("peer", "", "the Python peer script (default: peer.py beside this source, else benchmarks/pytorch/peer.py)")
	asJSON := flag.Bool("json", false, "print JSON lines instead of the table")
	out := flag.String("out", "", "also write DIR/pytorch.jsonl and DIR/pytorch.csv")
	timeout := flag.Duration("timeout", 2*time.Minute, "deadline of one message")
	inline := flag.Bool("python-inline", true, "the Python sink is an inline handler (Node.handle(..., inline=True): it may run on the connection's reader)")
	goShm := flag.Bool("go-shm", true, "Go <-> Go control connections over shared-memory rings (transport.shared_memory, the default); false: over TCP, as the Python node's always are")
	peerGPU := flag.Int("peer-gpu", 0, "with CUDA: the GPU of the receiving Go node and of the Python node (node0 stays on cuda:0), e.g. 1 for messages between two GPUs")
	flag.Parse()
	o, err := options(*minSize, *maxSize, *dev)
	if err != nil {
		fatal(err)
	}
	o.reps, o.python, o.peer, o.timeout, o.inline = *reps, *py, peerScript(*peer), *timeout, *inline
	o.goTCP = !*goShm
	if o.peerDevice = o.device; o.device.Kind == memory.KindCUDA {
		if n, _ := memory.CUDADeviceCount(); *peerGPU < 0 || *peerGPU >= n {
			fatal(fmt.Errorf("--peer-gpu %d: this host has %d GPUs", *peerGPU, n))
		}
		o.peerDevice = memory.CUDA(*peerGPU)
	}
	rs, err := run(o)
	if werr := write(rs, *asJSON, *out); werr != nil {
		err = errors.Join(err, werr)
	}
	summary(os.Stdout, rs)
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "pytorch:", err)
	os.Exit(1)
}

type opts struct {
	sizes  []int
	reps   int
	device memory.Device
	// peerDevice is where node1 (Python) and node2 (Go) keep their
	// tensors: device, or another GPU (--peer-gpu).
	peerDevice memory.Device
	python     string
	inline     bool // the Python sink runs inline
	goTCP      bool // the Go nodes' transport.shared_memory off
	peer       string
	timeout    time.Duration
}

func options(minSize, maxSize, dev string) (opts, error) {
	lo, err := size.Parse(minSize)
	if err != nil {
		return opts{}, err
	}
	hi, err := size.Parse(maxSize)
	if err != nil {
		return opts{}, err
	}
	if lo < 1 || hi < lo {
		return opts{}, fmt.Errorf("sizes %s … %s", minSize, maxSize)
	}
	var o opts
	for s := lo; s <= hi; s *= 4 {
		o.sizes = append(o.sizes, s)
	}
	gpuWhy := ""
	if n, err := memory.CUDADeviceCount(); err != nil || n == 0 {
		gpuWhy = fmt.Sprintf("no CUDA device (%v)", err)
	} else if err := ipc.Available(); err != nil {
		gpuWhy = err.Error()
	}
	switch dev {
	case "cpu":
		o.device = memory.CPU
	case "cuda":
		if gpuWhy != "" {
			return o, fmt.Errorf("--device cuda: %s", gpuWhy)
		}
		o.device = memory.CUDA(0)
	case "auto":
		o.device = memory.CUDA(0)
		if gpuWhy != "" {
			fmt.Fprintln(os.Stderr, "pytorch: on the CPU:", gpuWhy)
			o.device = memory.CPU
		}
	default:
		return o, fmt.Errorf("--device %q: want auto, cpu or cuda", dev)
	}
	return o, nil
}

func peerScript(given string) string {
	if given != "" {
		return given
	}
	if _, self, _, ok := runtime.Caller(0); ok {
		if p := filepath.Join(filepath.Dir(self), "peer.py"); fileExists(p) {
			return p
		}
	}
	return filepath.Join("benchmarks", "pytorch", "peer.py")
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func repsFor(o opts, n int) int {
	if o.reps > 0 {
		return o.reps
	}
	return max(5, min(200, (256<<20)/n))
}

// sinkProps answers each Msg with the channel that brought its tensor
// into node (the change of the node's counters: the sink handles one
// message at a time) and frees the tensor.
func sinkProps(node *actor.Node) *pa.Props {
	var prev map[string]actor.ChannelStats
	return pa.PropsFromFunc(func(c pa.Context) {
		m, ok := c.Message().(*Msg)
		if !ok {
			return
		}
		via := "inline"
		now := node.Stats().Channels
		for name, s := range now {
			if s.Transfers > prev[name].Transfers {
				via = name
			}
		}
		prev = now
		if m.T != nil {
			_ = m.T.Free()
		}
		c.Respond(&Ack{Via: via})
	})
}

// cluster is the three nodes.
type cluster struct {
	cfg   *config.Config
	node  *actor.Node
	child *exec.Cmd
	chIn  io.WriteCloser
	py    *exec.Cmd
	pyIn  io.WriteCloser
	pyOut *bufio.Reader
	dir   string
}

func start(o opts) (c *cluster, err error) {
	cfg, err := config.LocalConfig("bench-pytorch", 3)
	if err != nil {
		return nil, err
	}
	// 1 GiB through TCP on the CPU keeps the cores busy: heartbeats must
	// not declare a peer dead meanwhile.
	cfg.HeartbeatInterval, cfg.FailureTimeout = 500*time.Millisecond, 20*time.Second
	cfg.Flow.TransferTimeout = o.timeout
	cfg.Transport.SharedMemory = !o.goTCP
	cfg.Nodes[0].Devices = []memory.Device{o.device}
	cfg.Nodes[2].Devices = []memory.Device{o.peerDevice}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c = &cluster{cfg: cfg}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.close())
		}
	}()
	if c.dir, err = os.MkdirTemp("", "bench-pytorch-"); err != nil {
		return c, err
	}
	path, err := cfg.WriteFiles(c.dir)
	if err != nil {
		return c, err
	}
	spec, _ := json.Marshal(childSpec{Config: path, Node: cfg.Nodes[2].Name})
	exe, err := os.Executable()
	if err != nil {
		return c, err
	}
	c.child = exec.Command(exe)
	c.child.Env = append(os.Environ(), childEnv+"="+string(spec))
	c.child.Stderr = os.Stderr
	// The child stops at its stdin's end (close).
	if c.chIn, err = c.child.StdinPipe(); err != nil {
		return c, err
	}
	if err := c.child.Start(); err != nil {
		c.child = nil
		return c, fmt.Errorf("start the Go peer: %w", err)
	}
	pc, _ := json.Marshal(map[string]any{
		"cluster": cfg.Cluster, "secret": string(cfg.Secret), "name": cfg.Nodes[1].Name,
		"address": cfg.Nodes[1].Address, "data_address": cfg.Nodes[1].DataAddress, "go": cfg.Nodes[0].Name,
		"peers": map[string]any{cfg.Nodes[0].Name: map[string]string{
			"address": cfg.Nodes[0].Address, "data_address": cfg.Nodes[0].DataAddress}},
		"inline_threshold": cfg.Transport.InlineThreshold, "cuda": o.device.Kind == memory.KindCUDA, "device": o.peerDevice.String(), "inline": o.inline,
		"heartbeat": cfg.HeartbeatInterval.Seconds(), "failure_timeout": cfg.FailureTimeout.Seconds(),
	})
	c.py = exec.Command(o.python, o.peer)
	c.py.Env = append(os.Environ(), "TF_BENCH_PEER="+string(pc), "PYTHONDONTWRITEBYTECODE=1")
	c.py.Stderr = os.Stderr
	if c.pyIn, err = c.py.StdinPipe(); err != nil {
		return c, err
	}
	out, err := c.py.StdoutPipe()
	if err != nil {
		return c, err
	}
	if err := c.py.Start(); err != nil {
		c.py = nil
		return c, fmt.Errorf("start the Python peer (%s %s): %w", o.python, o.peer, err)
	}
	c.pyOut = bufio.NewReader(out)
	if c.node, err = actor.NewNode(cfg, cfg.Nodes[0].Name, actor.WithLogger(zap.NewNop())); err != nil {
		return c, err
	}
	if err := c.node.Start(); err != nil {
		c.node = nil
		return c, err
	}
	if _, err := c.node.Root().SpawnNamed(sinkProps(c.node), "sink"); err != nil {
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []string{cfg.Nodes[1].Name, cfg.Nodes[2].Name} {
		if err := c.node.WaitPeer(ctx, n); err != nil {
			return c, err
		}
	}
	if _, err := c.ask("wait"); err != nil {
		return c, err
	}
	return c, nil
}

// ask sends the Python peer one command and returns its answer line.
func (c *cluster) ask(cmd string) (string, error) {
	if _, err := io.WriteString(c.pyIn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("python peer: %w", err)
	}
	l, err := c.pyOut.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("python peer: %s: %w", cmd, err)
	}
	l = strings.TrimSpace(l)
	if !strings.HasPrefix(l, "ok") {
		return "", fmt.Errorf("python peer: %s: %s", cmd, l)
	}
	return strings.TrimSpace(strings.TrimPrefix(l, "ok")), nil
}

func (c *cluster) close() error {
	var err error
	if c.node != nil {
		err = c.node.Stop()
	}
	if c.py != nil {
		_ = c.pyIn.Close()
		err = errors.Join(err, waitOrKill(c.py))
	}
	if c.child != nil {
		_ = c.chIn.Close()
		err = errors.Join(err, waitOrKill(c.child))
	}
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
	return err
}

func waitOrKill(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return errors.Join(errors.New("peer did not stop: killed"), <-done)
	}
}

// request times one message from node0 to pid holding t.
func (c *cluster) request(ctx context.Context, pid *pa.PID, t *tensor.Tensor, timeout time.Duration) (time.Duration, string, error) {
	start := time.Now()
	res, err := c.node.Root().RequestFuture(pid, &Msg{T: t}, timeout).Result()
	d := time.Since(start)
	if err != nil {
		return 0, "", err
	}
	a, ok := res.(*Ack)
	if !ok {
		return 0, "", fmt.Errorf("answer %T, want *Ack", res)
	}
	// The receiver released the tensor; wait for it (untimed) before it
	// is lent again.
	return d, a.Via, t.WaitReleased(ctx)
}

func run(o opts) (rs []report.Result, err error) {
	c, err := start(o)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	ctx := context.Background()
	goPID := c.node.PID(c.cfg.Nodes[2].Name, "sink")
	pyPID := c.node.PID(c.cfg.Nodes[1].Name, "sink")
	for _, n := range o.sizes {
		t, err := tensor.New(o.device, tensor.Uint8, tensor.Shape{int64(n)})
		if err != nil {
			return rs, err
		}
		reps := repsFor(o, n)
		times := map[string][]time.Duration{}
		via := map[string]string{}
		// Two untimed messages each, then alternating repetitions.
		for i := range reps + 2 {
			for _, p := range []struct {
				path string
				pid  *pa.PID
			}{{"go-go", goPID}, {"go-python", pyPID}} {
				d, ch, err := c.request(ctx, p.pid, t, o.timeout)
				if err != nil {
					_ = t.Free()
					return rs, fmt.Errorf("%s %s: %w", p.path, size.Format(n), err)
				}
				if i >= 2 {
					times[p.path] = append(times[p.path], d)
				}
				via[p.path] = ch
			}
			l, err := c.ask(fmt.Sprintf("send %d 1", n))
			if err != nil {
				_ = t.Free()
				return rs, fmt.Errorf("python-go %s: %w", size.Format(n), err)
			}
			f := strings.Fields(l) // "<seconds> <channel>"
			if len(f) != 2 {
				_ = t.Free()
				return rs, fmt.Errorf("python-go: answer %q", l)
			}
			s, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				_ = t.Free()
				return rs, fmt.Errorf("python-go: answer %q", l)
			}
			if i >= 2 {
				times["python-go"] = append(times["python-go"], time.Duration(s*1e9))
			}
			via["python-go"] = f[1]
		}
		_ = t.Free()
		for _, p := range []string{"go-go", "go-python", "python-go"} {
			med := report.Median(times[p])
			rs = append(rs,
				report.Result{Bench: "pytorch", Path: p, Size: int64(n), Metric: report.LatencyUs, Value: report.Us(med), N: len(times[p]), Channel: via[p]},
				report.Result{Bench: "pytorch", Path: p, Size: int64(n), Metric: report.GBps, Value: report.Bandwidth(int64(n), med), N: len(times[p]), Channel: via[p]})
		}
		fmt.Fprintf(os.Stderr, "pytorch: %s done\n", size.Format(n))
	}
	return rs, nil
}

// write prints the results and writes them under dir.
func write(rs []report.Result, asJSON bool, dir string) error {
	var err error
	if asJSON {
		err = report.WriteJSON(os.Stdout, rs)
	} else {
		err = report.WriteTable(os.Stdout, rs)
	}
	if dir == "" || len(rs) == 0 {
		return err
	}
	if e := os.MkdirAll(dir, 0o755); e != nil {
		return errors.Join(err, e)
	}
	f, e := os.Create(filepath.Join(dir, "pytorch.jsonl"))
	if e != nil {
		return errors.Join(err, e)
	}
	err = errors.Join(err, report.WriteJSON(f, rs), f.Close())
	g, e := os.Create(filepath.Join(dir, "pytorch.csv"))
	if e != nil {
		return errors.Join(err, e)
	}
	w := csv.NewWriter(g)
	_ = w.Write([]string{"bench", "path", "size", "metric", "value", "n", "channel"})
	for _, r := range rs {
		_ = w.Write([]string{r.Bench, r.Path, strconv.FormatInt(r.Size, 10), r.Metric,
			strconv.FormatFloat(r.Value, 'g', 6, 64), strconv.Itoa(r.N), r.Channel})
	}
	w.Flush()
	return errors.Join(err, w.Error(), g.Close())
}

// summary states the targets: the Python paths beside go-go.
func summary(w io.Writer, rs []report.Result) {
	val := map[string]float64{}
	var sizes []int64
	for _, r := range rs {
		val[fmt.Sprintf("%s/%d/%s", r.Path, r.Size, r.Metric)] = r.Value
		if r.Path == "go-go" && r.Metric == report.GBps {
			sizes = append(sizes, r.Size)
		}
	}
	fmt.Fprintln(w, "--- issue 33 targets: ≥ 90 % of go-go's bandwidth at ≥ 16 MiB, ≤ 1.5× go-go's time at ≤ 1 MiB")
	for _, n := range sizes {
		for _, p := range []string{"go-python", "python-go"} {
			switch {
			case n >= 16<<20:
				r := val[fmt.Sprintf("%s/%d/%s", p, n, report.GBps)] / val[fmt.Sprintf("go-go/%d/%s", n, report.GBps)]
				fmt.Fprintf(w, "%-9s %8s  %5.1f %% of go-go's bandwidth  %s\n", p, size.Format(int(n)), 100*r, verdict(r >= 0.9))
			case n <= 1<<20:
				r := val[fmt.Sprintf("%s/%d/%s", p, n, report.LatencyUs)] / val[fmt.Sprintf("go-go/%d/%s", n, report.LatencyUs)]
				fmt.Fprintf(w, "%-9s %8s  %5.2f× go-go's time          %s\n", p, size.Format(int(n)), r, verdict(r <= 1.5))
			}
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// child runs node2: a Go node with the actor "sink", until stdin ends.
func child() error {
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
		return fmt.Errorf("%s: %w", childEnv, err)
	}
	cfg, err := config.Load(spec.Config)
	if err != nil {
		return err
	}
	node, err := actor.NewNode(cfg, spec.Node, actor.WithLogger(zap.NewNop()))
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	if _, err := node.Root().SpawnNamed(sinkProps(node), "sink"); err != nil {
		return errors.Join(err, node.Stop())
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return node.Stop()
}
