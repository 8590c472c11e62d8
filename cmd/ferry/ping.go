package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/progress"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

// joinAndWait starts node from and waits until to is up, turning a timeout
// into a clear "unreachable" error.
func joinAndWait(configPath, from, to string, wait time.Duration, level string, opts ...actor.Option) (*actor.Node, *config.Config, error) {
	log, err := newLogger(level)
	if err != nil {
		return nil, nil, err
	}
	node, cfg, err := startNode(configPath, from, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := cfg.Node(to); !ok {
		_ = node.Stop()
		return nil, nil, &exitError{code: 2, err: fmt.Errorf("node %q is not in the config", to)}
	}
	if err := waitReachable(node, to, wait); err != nil {
		_ = node.Stop()
		return nil, nil, &exitError{code: 3, err: fmt.Errorf("node %s unreachable: %w", to, err)}
	}
	return node, cfg, nil
}

// refusedGrace is how long a node may refuse connections before ping and
// bench give up: long enough for a node that is starting to listen, much
// shorter than --timeout.
const refusedGrace = time.Second

// waitReachable waits until node sees to up, for at most wait. It fails
// as soon as the cause is clear: a handshake the peer refused (wrong
// secret or cluster, a node it does not know) at once, connections
// refused after refusedGrace; a node that accepts but has not answered yet
// gets the whole wait.
func waitReachable(node *actor.Node, to string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	up := make(chan error, 1)
	go func() { up <- node.WaitPeer(ctx, to) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var refusedSince time.Time
	for {
		select {
		case err := <-up:
			if err == nil {
				return nil
			}
			if why := node.PeerError(to); why != nil {
				return why
			}
			return fmt.Errorf("no connection within %v", wait)
		case <-tick.C:
			why := node.PeerError(to)
			switch {
			case why == nil:
				refusedSince = time.Time{}
			case handshakeRefused(why):
				cancel()
				<-up
				return why
			case errors.Is(why, syscall.ECONNREFUSED):
				if refusedSince.IsZero() {
					refusedSince = time.Now()
				} else if time.Since(refusedSince) >= refusedGrace {
					cancel()
					<-up
					return why
				}
			}
		}
	}
}

// handshakeRefused reports whether err is a peer's refusal of the
// handshake (a wrong secret or cluster, a node it does not know), which
// waiting does not cure.
func handshakeRefused(err error) bool {
	var ce *wire.ConnError
	return errors.Is(err, wire.ErrAuthFailed) || (errors.As(err, &ce) && (ce.Code == wire.CodeAuth || ce.Code == wire.CodeVersion || ce.Code == wire.CodeNotFound))
}

func runPing(args []string, stdout io.Writer) error {
	fs := newFlags("ping")
	configPath := fs.String("config", "", "cluster config file (YAML)")
	from := fs.String("from", "", "join the cluster as this node (must be in the config, not running)")
	to := fs.String("to", "", "node to ping")
	count := fs.Int("count", 10, "number of round trips")
	size := fs.Int("size", 64, "payload bytes")
	wait := fs.Duration("timeout", 10*time.Second, "how long to wait for the node to be reachable")
	level := fs.String("log-level", "warn", "log level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config", "from", "to"); err != nil {
		return err
	}
	if *count < 1 || *size < 0 {
		return &exitError{code: 2, err: fmt.Errorf("--count must be ≥ 1 and --size ≥ 0")}
	}
	node, _, err := joinAndWait(*configPath, *from, *to, *wait, *level)
	if err != nil {
		return err
	}
	defer node.Stop()
	payload := make([]byte, *size)
	rtts := make([]time.Duration, 0, *count)
	for i := range *count {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), *wait)
		err := node.Ping(ctx, *to, payload)
		cancel()
		if err != nil {
			return fmt.Errorf("round trip %d to %s: %w", i, *to, err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	fmt.Fprintf(stdout, "%d round trips %s -> %s (%d-byte payload): min %v p50 %v p99 %v\n",
		len(rtts), *from, *to, *size, rtts[0], percentile(rtts, 0.50), percentile(rtts, 0.99))
	return nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func runBench(args []string, stdout io.Writer) error {
	fs := newFlags("bench")
	configPath := fs.String("config", "", "cluster config file (YAML)")
	from := fs.String("from", "", "join the cluster as this node (must be in the config, not running)")
	to := fs.String("to", "", "node to send tensors to")
	sizeFlag := fs.String("size", "64MiB", "tensor size (bytes, or with KiB/MiB/GiB)")
	count := fs.Int("count", 10, "number of transfers")
	device := fs.String("device", "cpu", "device of the sent tensor (cpu, cuda:N)")
	wait := fs.Duration("timeout", 60*time.Second, "deadline of one transfer")
	level := fs.String("log-level", "warn", "log level")
	showProgress := fs.Bool("progress", false, "print a progress line on stderr even when it is not a terminal")
	mf := addMetricsFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config", "from", "to"); err != nil {
		return err
	}
	size, err := config.ParseSize(*sizeFlag)
	if err != nil || size <= 0 {
		return &exitError{code: 2, err: fmt.Errorf("--size %q: want a positive size", *sizeFlag)}
	}
	dev, err := memory.ParseDevice(*device)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	traced, flush, err := startTracing()
	if err != nil {
		return err
	}
	defer flush()
	node, cfg, err := joinAndWait(*configPath, *from, *to, *wait, *level, traced...)
	if err != nil {
		return err
	}
	defer node.Stop()
	stopMetrics, err := mf.serve(node, cfg, stdout)
	if err != nil {
		return err
	}
	defer stopMetrics()
	t, err := tensor.New(dev, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return err
	}
	defer t.Free()
	var times []time.Duration
	prog := progress.New(os.Stderr, *showProgress)
	defer prog.Close()
	prog.Phase(1, 1, fmt.Sprintf("transfers of %s to %s", config.FormatSize(size), *to), int64(*count))
	for i := range *count {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), *wait)
		got, err := node.PingTensor(ctx, *to, t)
		cancel()
		if err != nil {
			return fmt.Errorf("transfer %d: %w", i, err)
		}
		if got != int64(size) {
			return fmt.Errorf("transfer %d: %s received %d bytes, want %d", i, *to, got, size)
		}
		times = append(times, time.Since(start))
		ctx, cancel = context.WithTimeout(context.Background(), *wait)
		err = t.WaitReleased(ctx)
		cancel()
		if err != nil {
			return err
		}
		prog.Add(1)
	}
	prog.Close()
	slices.Sort(times)
	med := percentile(times, 0.5)
	dst := memory.CPU
	if nc, ok := cfg.Node(*to); ok && len(nc.Devices) > 0 {
		dst = nc.Devices[0]
	}
	topo := node.Topology()
	mine, theirs := topo.Self, topo.Peers[*to]
	choice := rdma.Select(&mine, &theirs, dev, dst)
	fmt.Fprintf(stdout, "%d transfers of %s from %s (%s) to %s (%s) over %s: median %v, %.2f GB/s\n",
		len(times), config.FormatSize(size), *from, dev, *to, dst, choice.Channel, med, float64(size)/med.Seconds()/1e9)
	return nil
}
