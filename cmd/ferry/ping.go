package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// joinAndWait starts node from and waits until to is up, turning a timeout
// into a clear "unreachable" error.
func joinAndWait(config, from, to string, wait time.Duration, level string) (*actor.Node, *cluster.Config, error) {
	log, err := newLogger(level)
	if err != nil {
		return nil, nil, err
	}
	node, cfg, err := startNode(config, from, log)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := cfg.Node(to); !ok {
		_ = node.Stop()
		return nil, nil, &exitError{code: 2, err: fmt.Errorf("node %q is not in the config", to)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := node.WaitPeer(ctx, to); err != nil {
		why := node.PeerError(to)
		_ = node.Stop()
		if why == nil {
			why = fmt.Errorf("no connection within %v", wait)
		}
		return nil, nil, &exitError{code: 3, err: fmt.Errorf("node %s unreachable: %w", to, why)}
	}
	return node, cfg, nil
}

func runPing(args []string, stdout io.Writer) error {
	fs := newFlags("ping")
	config := fs.String("config", "", "cluster config file (YAML)")
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
	node, _, err := joinAndWait(*config, *from, *to, *wait, *level)
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
	config := fs.String("config", "", "cluster config file (YAML)")
	from := fs.String("from", "", "join the cluster as this node (must be in the config, not running)")
	to := fs.String("to", "", "node to send tensors to")
	sizeFlag := fs.String("size", "64MiB", "tensor size (bytes, or with KiB/MiB/GiB)")
	count := fs.Int("count", 10, "number of transfers")
	device := fs.String("device", "cpu", "device of the sent tensor (cpu, cuda:N)")
	wait := fs.Duration("timeout", 60*time.Second, "deadline of one transfer")
	level := fs.String("log-level", "warn", "log level")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config", "from", "to"); err != nil {
		return err
	}
	size, err := cluster.ParseSize(*sizeFlag)
	if err != nil || size <= 0 {
		return &exitError{code: 2, err: fmt.Errorf("--size %q: want a positive size", *sizeFlag)}
	}
	dev, err := memory.ParseDevice(*device)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	node, cfg, err := joinAndWait(*config, *from, *to, *wait, *level)
	if err != nil {
		return err
	}
	defer node.Stop()
	t, err := tensor.New(dev, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return err
	}
	defer t.Free()
	var times []time.Duration
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
	}
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
		len(times), cluster.FormatSize(size), *from, dev, *to, dst, choice.Channel, med, float64(size)/med.Seconds()/1e9)
	return nil
}
