package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

func init() {
	tfactor.MustRegisterMessage("bench.gpu.Msg", &Msg{})
	tfactor.MustRegisterMessage("bench.gpu.Ack", &Ack{})
}

// receiverEnv makes this program the receiving process; its value is a
// receiverSpec in JSON.
const receiverEnv = "TENSORFERRY_GPU_BENCH_RECEIVER"

// receiverSpec is what the sending process tells the receiving one.
type receiverSpec struct {
	Config string        `json:"config"` // cluster.yaml written by the sender
	Node   string        `json:"node"`
	Device memory.Device `json:"device"`
	// Profile, when set, is where the receiver writes its CPU profile.
	Profile string `json:"profile,omitempty"`
	// Trace, when set, is where the receiver writes its execution trace.
	Trace string `json:"trace,omitempty"`
	// Log makes the receiver log warnings and errors to its stderr.
	Log bool `json:"log,omitempty"`
	// Sinks is how many sink actors the receiver starts (0: one): "sink",
	// then "sink1", "sink2", … (the fanout mode's receivers).
	Sinks int `json:"sinks,omitempty"`
}

func isReceiver() bool { return os.Getenv(receiverEnv) != "" }

// runReceiver is the receiving process: it starts its node and the sink
// actor, prints "ready", and stops when its standard input closes.
func runReceiver() {
	if err := receive(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gpu: receiver: %v\n", err)
		os.Exit(1)
	}
}

func receive(stdin io.Reader, stdout io.Writer) error {
	var spec receiverSpec
	if err := json.Unmarshal([]byte(os.Getenv(receiverEnv)), &spec); err != nil {
		return fmt.Errorf("%s: %w", receiverEnv, err)
	}
	if spec.Profile != "" {
		stop, err := report.StartCPUProfile(spec.Profile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if spec.Trace != "" {
		stop, err := report.StartTrace(spec.Trace)
		if err != nil {
			return err
		}
		defer stop()
	}
	cfg, err := config.Load(spec.Config)
	if err != nil {
		return err
	}
	opts := []tfactor.Option{quiet()}
	if spec.Log {
		lg, err := zap.NewProduction(zap.IncreaseLevel(zap.WarnLevel))
		if err != nil {
			return err
		}
		defer lg.Sync()
		opts = append(opts, tfactor.WithLogger(lg.Named("receiver")))
	}
	node, err := tfactor.NewNode(cfg, spec.Node, opts...)
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer node.Stop()
	for i := range max(spec.Sinks, 1) {
		if _, err := node.Root().SpawnNamed(sinkProps(node, spec.Device, cfg.Transport.InlineThreshold), sinkName(i)); err != nil {
			return err
		}
	}
	pool := &destPool{dev: spec.Device}
	defer pool.close()
	if _, err := node.Root().SpawnNamed(sinkProps(node, spec.Device, cfg.Transport.InlineThreshold, node.WithDestinations(pool.get)), reuseSink); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, "ready"); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, stdin) // until the sender closes it
	return nil
}

func quiet() tfactor.Option {
	return tfactor.WithSystemConfig(
		pa.WithLoggerFactory(func(*pa.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }),
		pa.WithDeadLetterThrottleInterval(10*time.Millisecond))
}

// sinkProps is the receiving actor: tensors arrive on dev; it answers each
// Msg with an Ack naming the channel that carried it (from the node's
// counters, which grew by exactly that transfer). It has inline delivery,
// as a request/response service would: a message that arrives alone runs
// where the engine fetched it.
func sinkProps(node *tfactor.Node, dev memory.Device, inline int, opts ...pa.PropsOption) *pa.Props {
	last := node.Stats().Channels
	lastCh := "inline"
	return pa.PropsFromFunc(func(c pa.Context) {
		m, ok := c.Message().(*Msg)
		if !ok {
			return
		}
		now := node.Stats().Channels
		ack := &Ack{Bytes: m.T.ByteSize(), Channel: "inline", Device: m.T.Device().String()}
		most := int64(0)
		for _, name := range slices.Sorted(maps.Keys(now)) {
			// Several fetches may have ended since the last message (a
			// node fetches up to four at once; relay copies end before
			// the first fetch is delivered): the channel with the most of
			// them (the first by name of equals), and their average.
			st := now[name]
			if k := st.Transfers - last[name].Transfers; k > most {
				most = k
				ack.Channel, ack.Fetch = name, (st.Time-last[name].Time)/time.Duration(k)
				lastCh = name
			}
		}
		if ack.Channel == "inline" && ack.Bytes > int64(inline) {
			// Its fetch was counted with an earlier message's.
			ack.Channel = lastCh
		}
		last = now
		if m.Check {
			sum, err := checksum(m.T)
			ack.CRC = sum
			if err != nil {
				ack.Err = err.Error()
			}
		}
		_ = m.T.Free()
		c.Respond(ack)
	}, append([]pa.PropsOption{node.WithDevice(dev), node.WithInlineDelivery()}, opts...)...)
}

// checksum returns the CRC-32 of t's bytes, copying them to the host first
// when t is on a GPU.
func checksum(t *tensor.Tensor) (uint32, error) {
	if t.Device().IsHost() {
		return crc32.ChecksumIEEE(t.Host()), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := t.To(ctx, memory.CPU)
	if err != nil {
		return 0, err
	}
	defer h.Free()
	return crc32.ChecksumIEEE(h.Host()), nil
}

// actorPair is a sending node in this process and a receiving node in a
// child process (this program again), on one loopback cluster.
type actorPair struct {
	node     *tfactor.Node
	sink     *pa.PID
	sinks    []*pa.PID // every sink, sink first
	children []*child  // the receiving processes
	dir      string
	timeout  time.Duration
}

// child is a receiving process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// pairConfig says where each end's tensors live and which channels the
// cluster must not use.
type pairConfig struct {
	src, dst memory.Device
	disable  []string
	timeout  time.Duration
	profile  string // the receiver's CPU profile; "": none
	trace    string // the receiver's execution trace; "": none
	log      bool   // the receiver logs warnings and errors
	// readSpin is the control connection's read spin (transport.read_spin;
	// 0: the default).
	readSpin time.Duration
	sinks    int   // sink actors of the receiver (0: one)
	noRelay  bool  // flow.relay: false
	relayMin int64 // flow.relay_min_bytes; 0: the default
	fanout   int   // flow.relay_fanout; 0: the default
	noStream bool  // flow.relay_stream: false
	noPush   bool  // flow.relay_push: false
	// copyChunk is ipc.copy_chunk (0: the default).
	copyChunk int
	// nodes, when set, replaces the one receiving process on dst: one
	// receiving process (one node, one sink) on each device listed.
	nodes []memory.Device
}

// openPair writes the cluster's config, starts the receiving process and
// the sending node, and waits until the receiver's actor is up.
func openPair(pc pairConfig) (p *actorPair, err error) {
	recvDevs := pc.nodes
	if len(recvDevs) == 0 {
		recvDevs = []memory.Device{pc.dst}
	}
	cfg, err := config.LocalConfig("bench-gpu", 1+len(recvDevs))
	if err != nil {
		return nil, err
	}
	// 1 GiB through TCP keeps the cores busy: heartbeats must not declare
	// the peer dead meanwhile.
	cfg.HeartbeatInterval, cfg.FailureTimeout = 500*time.Millisecond, 10*time.Second
	cfg.Flow.TransferTimeout = pc.timeout
	cfg.Transport.ReadSpin = pc.readSpin
	if pc.readSpin < 0 {
		cfg.Transport.ReadSpin = config.ReadSpinOff
	}
	cfg.DisableChannels = pc.disable
	cfg.Flow.NoRelay, cfg.Flow.RelayMinBytes, cfg.Flow.RelayFanout, cfg.Flow.NoRelayStream = pc.noRelay, pc.relayMin, pc.fanout, pc.noStream
	cfg.Flow.NoRelayPush = pc.noPush
	cfg.IPC.CopyChunk = pc.copyChunk
	cfg.Nodes[0].Devices = []memory.Device{pc.src}
	for i, d := range recvDevs {
		cfg.Nodes[1+i].Devices = []memory.Device{d}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p = &actorPair{timeout: pc.timeout}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if p.dir, err = os.MkdirTemp("", "bench-gpu-"); err != nil {
		return p, err
	}
	path, err := cfg.WriteFiles(p.dir)
	if err != nil {
		return p, err
	}
	exe, err := os.Executable()
	if err != nil {
		return p, err
	}
	var readies []chan error
	for i, d := range recvDevs {
		sinks := pc.sinks
		if len(pc.nodes) > 0 {
			sinks = 1
		}
		prof, trace := pc.profile, pc.trace
		if len(pc.nodes) > 0 { // one file per receiving process
			prof, trace = suffix(prof, i), suffix(trace, i)
		}
		spec, err := json.Marshal(receiverSpec{Config: path, Node: cfg.Nodes[1+i].Name, Device: d, Profile: prof, Trace: trace, Log: pc.log, Sinks: sinks})
		if err != nil {
			return p, err
		}
		c := &child{cmd: exec.Command(exe, childArgs()...)}
		c.cmd.Env = append(os.Environ(), receiverEnv+"="+string(spec))
		c.cmd.Stderr = os.Stderr
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			return p, err
		}
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			return p, err
		}
		if err := c.cmd.Start(); err != nil {
			return p, fmt.Errorf("gpu: start receiver: %w", err)
		}
		p.children = append(p.children, c)
		ready := make(chan error, 1)
		readies = append(readies, ready)
		go func() {
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err == nil && strings.TrimSpace(line) != "ready" {
				err = fmt.Errorf("gpu: receiver said %q", line)
			}
			ready <- err
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	if p.node, err = tfactor.NewNode(cfg, cfg.Nodes[0].Name, quiet()); err != nil {
		return p, err
	}
	if err := p.node.Start(); err != nil {
		p.node = nil
		return p, err
	}
	for _, ready := range readies {
		select {
		case err := <-ready:
			if err != nil {
				return p, fmt.Errorf("gpu: receiver: %w", err)
			}
		case <-time.After(time.Minute):
			return p, errors.New("gpu: receiver not ready after a minute")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, nc := range cfg.Nodes[1:] {
		if err := p.node.WaitPeer(ctx, nc.Name); err != nil {
			return p, err
		}
	}
	p.sink = p.node.PID(cfg.Nodes[1].Name, "sink")
	if len(pc.nodes) > 0 {
		for _, nc := range cfg.Nodes[1:] {
			p.sinks = append(p.sinks, p.node.PID(nc.Name, "sink"))
		}
		return p, nil
	}
	for i := range max(pc.sinks, 1) {
		p.sinks = append(p.sinks, p.node.PID(cfg.Nodes[1].Name, sinkName(i)))
	}
	return p, nil
}

// suffix appends the receiving process's number to a file name ("": none).
func suffix(name string, i int) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf("%s%d", name, i)
}

// sinkName names the receiver's i-th sink actor.
func sinkName(i int) string {
	if i == 0 {
		return "sink"
	}
	return fmt.Sprintf("sink%d", i)
}

// childArgs are the receiving process's arguments; a test binary passes
// its own (it runs TestMain, which dispatches on receiverEnv).
var childArgs = func() []string { return nil }

// send sends x in one message and waits for the Ack; check asks the
// receiver to verify the bytes against want. It returns the time from
// the request until the Ack, then waits (untimed) until x's lease is
// back. It asks through Node.Request, as a request/response client would
// (the caller reads its reply itself).
func (p *actorPair) send(x *tensor.Tensor, check bool, want uint32) (time.Duration, *Ack, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	t0 := time.Now()
	res, err := p.node.Request(ctx, p.sink, &Msg{T: x, Check: check})
	d := time.Since(t0)
	if err != nil {
		return 0, nil, fmt.Errorf("gpu: %v: %w", x, err)
	}
	ack, ok := res.(*Ack)
	switch {
	case !ok:
		return 0, nil, fmt.Errorf("gpu: %v: reply %T %v", x, res, res)
	case ack.Err != "":
		return 0, nil, fmt.Errorf("gpu: %v: receiver: %s", x, ack.Err)
	case ack.Bytes != x.ByteSize():
		return 0, nil, fmt.Errorf("gpu: %v: receiver got %d bytes", x, ack.Bytes)
	case check && ack.CRC != want:
		return 0, nil, fmt.Errorf("gpu: %v: receiver's CRC-32 %08x, sent %08x", x, ack.CRC, want)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), p.timeout)
	defer wcancel()
	if err := x.WaitReleased(wctx); err != nil {
		return 0, nil, fmt.Errorf("gpu: %v: lease not released: %w", x, err)
	}
	return d, ack, nil
}

// stream sends x in n messages without waiting between them (only the
// first asks for a CRC check when check is set), then waits for every Ack.
// It returns the time from the first RequestFuture until the last Ack,
// then waits (untimed) until every lease of x is back.
func (p *actorPair) stream(x *tensor.Tensor, n int, check bool, want uint32) (time.Duration, []*Ack, error) {
	futures := make([]*pa.Future, n)
	t0 := time.Now()
	for i := range futures {
		futures[i] = p.node.Root().RequestFuture(p.sink, &Msg{T: x, Check: check && i == 0}, p.timeout)
	}
	acks := make([]*Ack, n)
	var errs []error
	for i, f := range futures {
		res, err := f.Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("gpu: %v: message %d of %d: %w", x, i, n, err))
			continue
		}
		ack, ok := res.(*Ack)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("gpu: %v: reply %T %v", x, res, res))
		case ack.Err != "":
			errs = append(errs, fmt.Errorf("gpu: %v: receiver: %s", x, ack.Err))
		case ack.Bytes != x.ByteSize():
			errs = append(errs, fmt.Errorf("gpu: %v: receiver got %d bytes", x, ack.Bytes))
		case check && i == 0 && ack.CRC != want:
			errs = append(errs, fmt.Errorf("gpu: %v: receiver's CRC-32 %08x, sent %08x", x, ack.CRC, want))
		}
		acks[i] = ack
	}
	d := time.Since(t0)
	wctx, wcancel := context.WithTimeout(context.Background(), p.timeout)
	defer wcancel()
	if err := x.WaitReleased(wctx); err != nil {
		errs = append(errs, fmt.Errorf("gpu: %v: leases not released: %w", x, err))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}
	return d, acks, nil
}

// close stops the sending node, then the receiving process (by closing its
// standard input), and removes the config.
func (p *actorPair) close() error {
	var errs []error
	if p.node != nil {
		errs = append(errs, p.node.Stop())
	}
	for _, c := range p.children {
		c.stdin.Close()
	}
	for _, c := range p.children {
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, fmt.Errorf("gpu: receiver: %w", err))
			}
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			errs = append(errs, fmt.Errorf("gpu: receiver did not stop; killed: %w", <-done))
		}
	}
	if p.dir != "" {
		errs = append(errs, os.RemoveAll(p.dir))
	}
	return errors.Join(errs...)
}
