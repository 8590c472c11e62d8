package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// The psexchange mode: the traffic of one synchronous step of a parameter
// server with one shard and one worker per GPU, one process per GPU. P
// bytes of float32 parameters are split into N shard ranges; each step
// every worker pushes its gradient's range i to shard i (lending a view of
// its gradient) and pulls every shard's weights into its own (the
// shard answers once every worker's gradient is in). What one step moves
// is the traffic of an allreduce of P bytes (a reduce-scatter, then an
// all-gather), so its time is set beside NCCL allreduce of P bytes
// (nccl_collectives.py). The kernels are left out: the mode times the
// exchange, not the arithmetic. Receivers fetch into their own tensors
// (Node.WithDestinations): a step allocates nothing.
const pathExchange = "tensorferry-psexchange"

func init() {
	for name, m := range map[string]any{
		"bench.gpu.XSetup": &XSetup{}, "bench.gpu.XReady": &XReady{}, "bench.gpu.XStep": &XStep{},
		"bench.gpu.XDone": &XDone{}, "bench.gpu.XPush": &XPush{}, "bench.gpu.XAck": &XAck{},
		"bench.gpu.XPull": &XPull{}, "bench.gpu.XWeights": &XWeights{},
	} {
		tfactor.MustRegisterMessage(name, m)
	}
}

// XSetup (re)allocates a shard's or worker's tensors for P parameter bytes
// over N shards; answered with XReady.
type XSetup struct {
	P     int64
	N     int
	Index int
}

// XReady answers XSetup.
type XReady struct{ Err string }

// XStep asks a worker for one step; answered with XDone once it holds
// every shard's weights. Check verifies the bytes of the step.
type XStep struct {
	Step  int
	Check bool
}

// XDone answers XStep.
type XDone struct {
	Step int
	Err  string
}

// XPush carries worker Worker's gradient for a shard; answered with XAck.
type XPush struct {
	Worker, Step int
	Check        bool
	G            *tensor.Tensor
}

// XAck answers XPush.
type XAck struct {
	Shard, Step int
	Err         string
}

// XPull asks a shard for its weights once every gradient of Step is in;
// answered with XWeights.
type XPull struct{ Step int }

// XWeights carries a shard's weights.
type XWeights struct {
	Shard, Step int
	W           *tensor.Tensor
	Err         string
}

// shardRange is the byte range of shard i of n over p bytes of float32.
func shardRange(p int64, n, i int) (lo, hi int) {
	elems := p / 4
	return int(4 * (int64(i) * elems / int64(n))), int(4 * (int64(i+1) * elems / int64(n)))
}

// views returns n views of t, one per shard range.
func views(t *tensor.Tensor, p int64, n int) ([]*tensor.Tensor, error) {
	var vs []*tensor.Tensor
	for i := range n {
		lo, hi := shardRange(p, n, i)
		b, err := t.Buffer().Slice(lo, hi-lo)
		if err != nil {
			return nil, err
		}
		v, err := tensor.FromBuffer(b, tensor.Float32, tensor.Shape{int64((hi - lo) / 4)})
		if err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// xShard holds shard Index's weights and a receive buffer per worker.
type xShard struct {
	node *tfactor.Node
	dev  memory.Device
	mu   sync.Mutex       // dests is read by the node's goroutines
	w    *tensor.Tensor   // filled with byte Index+1
	recv []*tensor.Tensor // worker j's gradient lands in recv[j]
	id   int
	n    int
	done int // steps whose gradients are all in
	got  int // gradients of step done
	bad  string
	pend []pendingX
}

type pendingX struct {
	to   *pa.PID
	step int
}

func (s *xShard) dest(msg any, _ *tensor.Descriptor) *tensor.Tensor {
	m, ok := msg.(*XPush)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Worker < 0 || m.Worker >= len(s.recv) {
		return nil
	}
	return s.recv[m.Worker]
}

func (s *xShard) free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.w != nil {
		_ = s.w.WaitReleased(ctx)
		_ = s.w.Free()
	}
	for _, t := range s.recv {
		_ = t.Free()
	}
	s.w, s.recv = nil, nil
}

func (s *xShard) setup(m *XSetup) error {
	s.free()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id, s.n, s.done, s.got, s.bad, s.pend = m.Index, m.N, 0, 0, "", nil
	lo, hi := shardRange(m.P, m.N, m.Index)
	shape := tensor.Shape{int64((hi - lo) / 4)}
	var err error
	if s.w, err = tensor.NewUninit(s.dev, tensor.Float32, shape); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := memory.Fill(ctx, s.w.Buffer(), byte(m.Index+1)); err != nil {
		return err
	}
	for range m.N {
		t, err := tensor.NewUninit(s.dev, tensor.Float32, shape)
		if err != nil {
			return err
		}
		s.recv = append(s.recv, t)
	}
	return nil
}

func (s *xShard) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *XSetup:
		err := s.setup(m)
		c.Respond(&XReady{Err: errString(err)})
	case *XPush:
		c.Respond(&XAck{Shard: s.id, Step: m.Step, Err: s.push(c, m)})
	case *XPull:
		if m.Step < s.done {
			s.answer(c, c.Sender(), m.Step)
		} else {
			s.pend = append(s.pend, pendingX{to: c.Sender(), step: m.Step})
		}
	case *pa.Stopped:
		s.free()
	}
}

// push takes a worker's gradient: in its receive buffer already when it
// came from another node, else copied there.
func (s *xShard) push(c pa.Context, m *XPush) string {
	if m.G == nil || m.Worker < 0 || m.Worker >= len(s.recv) || m.Step != s.done {
		return fmt.Sprintf("psexchange: shard %d: push of worker %d step %d at step %d", s.id, m.Worker, m.Step, s.done)
	}
	dst := s.recv[m.Worker]
	if m.G.Buffer().Ptr() != dst.Buffer().Ptr() || m.G.Device() != dst.Device() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := memory.Copy(ctx, dst.Buffer(), m.G.Buffer())
		cancel()
		if c.Sender() == nil || c.Sender().Address != s.node.Name() {
			_ = m.G.Free() // a tensor the node allocated
		}
		if err != nil {
			return err.Error()
		}
	}
	if m.Check {
		if err := checkBytes(dst, byte(m.Worker+1)); err != nil {
			return fmt.Sprintf("psexchange: shard %d: gradient of worker %d: %v", s.id, m.Worker, err)
		}
	}
	if s.got++; s.got == s.n {
		s.done++
		s.got = 0
		keep := s.pend[:0]
		for _, p := range s.pend {
			if p.step < s.done {
				s.answer(c, p.to, p.step)
			} else {
				keep = append(keep, p)
			}
		}
		s.pend = keep
	}
	return ""
}

func (s *xShard) answer(c pa.Context, to *pa.PID, step int) {
	c.Request(to, &XWeights{Shard: s.id, Step: step, W: s.w})
}

// xWorker holds a worker's weights and gradient, P bytes each.
type xWorker struct {
	node   *tfactor.Node
	dev    memory.Device
	mu     sync.Mutex // wViews is read by the node's goroutines
	w, g   *tensor.Tensor
	wViews []*tensor.Tensor
	gViews []*tensor.Tensor
	shards []*pa.PID
	id, n  int
	// the step in progress
	step        int
	check       bool
	from        *pa.PID
	acks, pulls int
	err         string
}

func (wk *xWorker) dest(msg any, _ *tensor.Descriptor) *tensor.Tensor {
	m, ok := msg.(*XWeights)
	if !ok {
		return nil
	}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if m.Shard < 0 || m.Shard >= len(wk.wViews) {
		return nil
	}
	return wk.wViews[m.Shard]
}

func (wk *xWorker) free() {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, v := range wk.gViews {
		_ = v.WaitReleased(ctx)
	}
	for _, t := range []*tensor.Tensor{wk.w, wk.g} {
		if t != nil {
			_ = t.Free()
		}
	}
	wk.w, wk.g, wk.wViews, wk.gViews = nil, nil, nil, nil
}

func (wk *xWorker) setup(m *XSetup) error {
	wk.free()
	wk.mu.Lock()
	defer wk.mu.Unlock()
	wk.id, wk.n, wk.from = m.Index, m.N, nil
	wk.shards = wk.shards[:0]
	for i := range m.N {
		wk.shards = append(wk.shards, wk.node.PID(fmt.Sprintf("node%d", i), "x-shard"))
	}
	shape := tensor.Shape{m.P / 4}
	var err error
	if wk.w, err = tensor.NewUninit(wk.dev, tensor.Float32, shape); err != nil {
		return err
	}
	if wk.g, err = tensor.NewUninit(wk.dev, tensor.Float32, shape); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := memory.Fill(ctx, wk.g.Buffer(), byte(m.Index+1)); err != nil {
		return err
	}
	if wk.wViews, err = views(wk.w, m.P, m.N); err != nil {
		return err
	}
	wk.gViews, err = views(wk.g, m.P, m.N)
	return err
}

func (wk *xWorker) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *XSetup:
		err := wk.setup(m)
		c.Respond(&XReady{Err: errString(err)})
	case *XStep:
		wk.start(c, m)
	case *XAck:
		if m.Err != "" && wk.err == "" {
			wk.err = m.Err
		}
		wk.acks++
		wk.maybeDone(c)
	case *XWeights:
		wk.weights(c, m)
		wk.pulls++
		wk.maybeDone(c)
	case *tfactor.DeliveryFailed:
		if wk.err == "" {
			wk.err = m.Error()
		}
		wk.acks, wk.pulls = wk.n, wk.n
		wk.maybeDone(c)
	case *pa.Stopped:
		wk.free()
	}
}

func (wk *xWorker) start(c pa.Context, m *XStep) {
	if wk.w == nil {
		c.Respond(&XDone{Step: m.Step, Err: "psexchange: worker not set up"})
		return
	}
	// The last step's gradient views are lent until every shard fetched
	// them (they were, before the shards answered: this does not wait).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, v := range wk.gViews {
		if err := v.WaitReleased(ctx); err != nil {
			c.Respond(&XDone{Step: m.Step, Err: err.Error()})
			return
		}
	}
	wk.step, wk.check, wk.from, wk.acks, wk.pulls, wk.err = m.Step, m.Check, c.Sender(), 0, 0, ""
	for i, s := range wk.shards {
		c.Request(s, &XPush{Worker: wk.id, Step: m.Step, Check: m.Check, G: wk.gViews[i]})
	}
	for _, s := range wk.shards {
		c.Request(s, &XPull{Step: m.Step})
	}
}

// weights puts a shard's weights in place: fetched there already when they
// came from another node, else copied there.
func (wk *xWorker) weights(c pa.Context, m *XWeights) {
	if m.W == nil || m.Shard < 0 || m.Shard >= len(wk.wViews) {
		wk.err = fmt.Sprintf("psexchange: worker %d: bad weights from shard %d", wk.id, m.Shard)
		return
	}
	dst := wk.wViews[m.Shard]
	if m.W.Buffer().Ptr() != dst.Buffer().Ptr() || m.W.Device() != dst.Device() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := memory.Copy(ctx, dst.Buffer(), m.W.Buffer())
		cancel()
		if c.Sender() == nil || c.Sender().Address != wk.node.Name() {
			_ = m.W.Free()
		}
		if err != nil {
			wk.err = err.Error()
			return
		}
	}
	if wk.check {
		if err := checkBytes(dst, byte(m.Shard+1)); err != nil {
			wk.err = fmt.Sprintf("psexchange: worker %d: weights of shard %d: %v", wk.id, m.Shard, err)
		}
	}
}

func (wk *xWorker) maybeDone(c pa.Context) {
	if wk.from == nil || wk.acks < wk.n || wk.pulls < wk.n {
		return
	}
	c.Send(wk.from, &XDone{Step: wk.step, Err: wk.err})
	wk.from = nil
}

// checkBytes reports whether every byte of t is v.
func checkBytes(t *tensor.Tensor, v byte) error {
	h := t.Host()
	if h == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := t.To(ctx, memory.CPU)
		if err != nil {
			return err
		}
		defer c.Free()
		h = c.Host()
	}
	for i, b := range h {
		if b != v {
			return fmt.Errorf("byte %d is %d, want %d", i, b, v)
		}
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// spawnExchange spawns a node's shard and worker on dev.
func spawnExchange(node *tfactor.Node, dev memory.Device) error {
	s := &xShard{node: node, dev: dev}
	if _, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return s },
		node.WithDevice(dev), node.WithDestinations(s.dest)), "x-shard"); err != nil {
		return err
	}
	wk := &xWorker{node: node, dev: dev}
	_, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return wk },
		node.WithDevice(dev), node.WithDestinations(wk.dest)), "x-worker")
	return err
}

// exchangeEnv makes this program one process of the psexchange mode; its
// value is an exchangeSpec in JSON.
const exchangeEnv = "TENSORFERRY_GPU_BENCH_EXCHANGE"

type exchangeSpec struct {
	Config string        `json:"config"`
	Node   string        `json:"node"`
	Device memory.Device `json:"device"`
}

func isExchanger() bool { return os.Getenv(exchangeEnv) != "" }

// runExchanger is one process of the psexchange mode but the first: its
// node, shard and worker; it prints "ready" and stops when its standard
// input closes.
func runExchanger() {
	if err := exchanger(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gpu: psexchange: %v\n", err)
		os.Exit(1)
	}
}

func exchanger(stdin io.Reader, stdout io.Writer) error {
	var spec exchangeSpec
	if err := json.Unmarshal([]byte(os.Getenv(exchangeEnv)), &spec); err != nil {
		return fmt.Errorf("%s: %w", exchangeEnv, err)
	}
	cfg, err := config.Load(spec.Config)
	if err != nil {
		return err
	}
	node, err := tfactor.NewNode(cfg, spec.Node, quiet())
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer node.Stop()
	if err := spawnExchange(node, spec.Device); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, stdin)
	return nil
}

// exchangeGroup is the psexchange mode's processes: node0 in this one.
type exchangeGroup struct {
	node     *tfactor.Node
	children []*exec.Cmd
	stdins   []io.WriteCloser
	dir      string
	n        int
	timeout  time.Duration
}

// openExchange starts one node per device, this process's on devs[0].
func openExchange(devs []memory.Device, timeout time.Duration) (g *exchangeGroup, err error) {
	n := len(devs)
	cfg, err := config.LocalConfig("bench-psx", n)
	if err != nil {
		return nil, err
	}
	cfg.HeartbeatInterval, cfg.FailureTimeout = 500*time.Millisecond, 10*time.Second
	cfg.Flow.TransferTimeout = timeout
	for i := range n {
		cfg.Nodes[i].Devices = []memory.Device{devs[i]}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g = &exchangeGroup{n: n, timeout: timeout}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.close())
		}
	}()
	if g.dir, err = os.MkdirTemp("", "bench-psx-"); err != nil {
		return g, err
	}
	path, err := cfg.WriteFiles(g.dir)
	if err != nil {
		return g, err
	}
	exe, err := os.Executable()
	if err != nil {
		return g, err
	}
	ready := make(chan error, n)
	for i := 1; i < n; i++ {
		spec, err := json.Marshal(exchangeSpec{Config: path, Node: cfg.Nodes[i].Name, Device: devs[i]})
		if err != nil {
			return g, err
		}
		cmd := exec.Command(exe, childArgs()...)
		cmd.Env = append(os.Environ(), exchangeEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return g, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return g, err
		}
		if err := cmd.Start(); err != nil {
			return g, fmt.Errorf("gpu: start %s: %w", cfg.Nodes[i].Name, err)
		}
		g.children, g.stdins = append(g.children, cmd), append(g.stdins, stdin)
		go func() {
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err == nil && strings.TrimSpace(line) != "ready" {
				err = fmt.Errorf("gpu: psexchange process said %q", line)
			}
			ready <- err
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	if g.node, err = tfactor.NewNode(cfg, cfg.Nodes[0].Name, quiet()); err != nil {
		return g, err
	}
	if err := g.node.Start(); err != nil {
		g.node = nil
		return g, err
	}
	if err := spawnExchange(g.node, devs[0]); err != nil {
		return g, err
	}
	deadline := time.After(time.Minute)
	for range n - 1 {
		select {
		case err := <-ready:
			if err != nil {
				return g, err
			}
		case <-deadline:
			return g, errors.New("gpu: psexchange processes not ready after a minute")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 1; i < n; i++ {
		if err := g.node.WaitPeer(ctx, cfg.Nodes[i].Name); err != nil {
			return g, err
		}
	}
	return g, nil
}

// all sends msg to actor id of every node and waits for every answer;
// answer checks one.
func (g *exchangeGroup) all(id string, msg any, answer func(any) error) error {
	fs := make([]*pa.Future, g.n)
	for i := range g.n {
		fs[i] = g.node.Root().RequestFuture(g.node.PID(fmt.Sprintf("node%d", i), id), msg, g.timeout)
	}
	var errs []error
	for i, f := range fs {
		res, err := f.Result()
		if err == nil {
			err = answer(res)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node%d %s: %w", i, id, err))
		}
	}
	return errors.Join(errs...)
}

func (g *exchangeGroup) setup(p int64) error {
	for _, id := range []string{"x-shard", "x-worker"} {
		fs := make([]*pa.Future, g.n)
		for i := range g.n {
			fs[i] = g.node.Root().RequestFuture(g.node.PID(fmt.Sprintf("node%d", i), id), &XSetup{P: p, N: g.n, Index: i}, g.timeout)
		}
		for i, f := range fs {
			res, err := f.Result()
			if r, ok := res.(*XReady); err == nil && (!ok || r.Err != "") {
				err = fmt.Errorf("answer %T %v", res, res)
			}
			if err != nil {
				return fmt.Errorf("node%d %s setup: %w", i, id, err)
			}
		}
	}
	return nil
}

// step runs one step on every worker and returns the time until the last
// one holds every shard's weights.
func (g *exchangeGroup) step(step int, check bool) (time.Duration, error) {
	t0 := time.Now()
	err := g.all("x-worker", &XStep{Step: step, Check: check}, func(res any) error {
		d, ok := res.(*XDone)
		switch {
		case !ok:
			return fmt.Errorf("answer %T %v", res, res)
		case d.Err != "":
			return errors.New(d.Err)
		case d.Step != step:
			return fmt.Errorf("step %d done, want %d", d.Step, step)
		}
		return nil
	})
	return time.Since(t0), err
}

func (g *exchangeGroup) close() error {
	var errs []error
	if g.node != nil {
		// The actors free their tensors as they stop.
		errs = append(errs, g.node.Stop())
	}
	for i, cmd := range g.children {
		g.stdins[i].Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, fmt.Errorf("gpu: psexchange process %d: %w", i+1, err))
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			errs = append(errs, fmt.Errorf("gpu: psexchange process %d did not stop; killed: %w", i+1, <-done))
		}
	}
	if g.dir != "" {
		errs = append(errs, os.RemoveAll(g.dir))
	}
	return errors.Join(errs...)
}

// runExchange times the exchange on --gpus GPUs (default all), one process
// each, at every --ps-sizes P.
func runExchange(o options) ([]report.Result, error) {
	n, why := gpuCount()
	if n == 0 {
		return nil, errors.New(why)
	}
	if o.gpus > 0 {
		if o.gpus > n {
			return nil, fmt.Errorf("--gpus %d: the driver sees %d", o.gpus, n)
		}
		n = o.gpus
	}
	devs := make([]memory.Device, n)
	for i := range devs {
		devs[i] = cudaDev(i)
	}
	return measureExchange(o, devs)
}

// measureExchange runs the exchange on one process per device.
func measureExchange(o options, devs []memory.Device) (rs []report.Result, err error) {
	g, err := openExchange(devs, o.timeout)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, g.close()) }()
	for _, p := range o.psSizes {
		if err := g.setup(int64(p)); err != nil {
			return rs, err
		}
		before := g.node.Stats().Channels
		warm, reps := 2, repsFor(o, p)
		var ds []time.Duration
		for i := range warm + reps {
			d, err := g.step(i, i == 0)
			if err != nil {
				return rs, fmt.Errorf("psexchange P=%s step %d: %w", size.Format(p), i, err)
			}
			if i >= warm {
				ds = append(ds, d)
			}
		}
		ch, most := "local", int64(0)
		for name, st := range g.node.Stats().Channels {
			if b := st.Bytes - before[name].Bytes; b > most {
				ch, most = name, b
			}
		}
		for _, r := range figures(pathExchange, p, ds, ch) {
			r.Path = fmt.Sprintf("%s-%dgpu", pathExchange, len(devs))
			rs = append(rs, o.emit(r))
		}
	}
	return rs, nil
}

// parseSizes parses a comma-separated list of sizes.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := size.Parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if n < 4*1024 || n%4 != 0 {
			return nil, fmt.Errorf("parameter bytes %s: want at least 4KiB, a multiple of 4", f)
		}
		out = append(out, n)
	}
	return out, nil
}
