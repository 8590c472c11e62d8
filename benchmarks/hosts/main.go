// Command hosts measures fan-out by relay across hosts without a second
// host: 1+N nodes of one process on loopback stand for two hosts
// (actor.WithHostID), the owner alone on host a and N receivers on host b.
// The data connections that cross between the hosts share one link of
// --link bytes per second (a token bucket on the receiving side, as one
// NIC's ingress would be), while those within host b are not limited.
// node0 sends one tensor of --size to an actor on each receiver at once
// (a RequestFuture each; the time runs until the last Ack), with relay on
// (the owner names the first receiver of host b in the others'
// descriptors: one transfer crosses the link) and off (each receiver
// fetches from the owner: N transfers share it). The baseline is one
// receiver, in the same run.
//
//	go run ./hosts                       # 3 receivers, 32 MiB over a 1 GB/s link
//	go run ./hosts --receivers 1,2,4,8 --size 64MiB --link 2GB
//	go run ./hosts --receivers 8 --whole   # relayed copies wait for their holder's whole copy
//
// Each line: receivers, relay on or off, median time in ms over --reps,
// and that time over one receiver's (relay off); --json prints
// report.Result lines (metric "us", Receivers set; path
// hosts-relay / hosts-norelay) for benchmarks/plot --receivers-at.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
)

// Weights is the message lent to every receiver; Ack answers it.
type Weights struct{ W *tensor.Tensor }

// Ack says what a receiver got: its bytes' CRC-32.
type Ack struct{ CRC uint32 }

func init() {
	actor.MustRegisterMessage("hosts.Weights", &Weights{})
	actor.MustRegisterMessage("hosts.Ack", &Ack{})
}

type options struct {
	receivers []int
	size      int
	link      float64 // bytes per second of the link between the hosts
	reps      int
	timeout   time.Duration
	whole     bool // flow.relay_stream: false
}

func main() {
	recv := flag.String("receivers", "3", "comma-separated receiver counts (one run each, relay on and off; 1 is always run)")
	sz := flag.String("size", "32MiB", "tensor size")
	link := flag.String("link", "1GB", "the link between the hosts, bytes per second (e.g. 1GB, 500MB)")
	reps := flag.Int("reps", 5, "timed repetitions per setting")
	asJSON := flag.Bool("json", false, "print report.Result JSON lines")
	timeout := flag.Duration("timeout", time.Minute, "deadline of one fan-out")
	whole := flag.Bool("whole", false, "the nodes' flow.relay_stream: false (relayed copies wait for their holder's whole copy)")
	flag.Parse()
	o, err := parse(*recv, *sz, *link, *reps, *timeout)
	o.whole = *whole
	if err != nil {
		fmt.Fprintln(os.Stderr, "hosts:", err)
		os.Exit(2)
	}
	rs, err := run(o)
	if *asJSON {
		_ = report.WriteJSON(os.Stdout, rs)
	} else {
		printTable(os.Stdout, rs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hosts:", err)
		os.Exit(1)
	}
}

func parse(recv, sz, link string, reps int, timeout time.Duration) (options, error) {
	o := options{reps: reps, timeout: timeout}
	for _, f := range strings.Split(recv, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 32 {
			return o, fmt.Errorf("--receivers %q: want counts from 1 to 32", recv)
		}
		o.receivers = append(o.receivers, n)
	}
	if !slices.Contains(o.receivers, 1) {
		o.receivers = append([]int{1}, o.receivers...)
	}
	slices.Sort(o.receivers)
	o.receivers = slices.Compact(o.receivers)
	var err error
	if o.size, err = size.Parse(sz); err != nil || o.size < 1<<20 {
		return o, fmt.Errorf("--size %q: want at least 1MiB", sz)
	}
	l := strings.TrimSuffix(strings.ToUpper(link), "B")
	mult := 1.0
	switch {
	case strings.HasSuffix(l, "G"):
		mult, l = 1e9, strings.TrimSuffix(l, "G")
	case strings.HasSuffix(l, "M"):
		mult, l = 1e6, strings.TrimSuffix(l, "M")
	}
	v, err := strconv.ParseFloat(l, 64)
	if err != nil || v <= 0 {
		return o, fmt.Errorf("--link %q: want a rate such as 1GB or 500MB", link)
	}
	o.link = v * mult
	if reps < 1 {
		return o, errors.New("--reps: want at least 1")
	}
	return o, nil
}

func run(o options) (rs []report.Result, err error) {
	for _, n := range o.receivers {
		for _, relay := range []bool{true, false} {
			d, err := measure(o, n, relay)
			if err != nil {
				return rs, fmt.Errorf("%d receivers, relay %v: %w", n, relay, err)
			}
			path := map[bool]string{true: "hosts-relay", false: "hosts-norelay"}[relay]
			rs = append(rs, report.Result{Bench: "hosts", Path: path, Size: int64(o.size), Metric: report.LatencyUs,
				Value: report.Us(d), N: o.reps, Channel: rdma.Staging, Receivers: n})
		}
	}
	return rs, nil
}

// linkBurst is what an idle link lets through at once, in bytes.
const linkBurst = 4 << 20

// limiter is a token bucket shared by the connections of one link.
type limiter struct {
	mu   sync.Mutex
	rate float64 // bytes per second
	next time.Time
}

// take waits until n more bytes may have crossed the link.
func (l *limiter) take(n int) {
	l.mu.Lock()
	now := time.Now()
	// An idle link banks at most linkBurst bytes, as a NIC's queue would.
	if floor := now.Add(-time.Duration(linkBurst / l.rate * float64(time.Second))); l.next.Before(floor) {
		l.next = floor
	}
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	until := l.next
	l.mu.Unlock()
	time.Sleep(time.Until(until))
}

// limitedConn reads through a limiter.
type limitedConn struct {
	net.Conn
	l *limiter
}

func (c limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p[:min(len(p), 256<<10)])
	if n > 0 {
		c.l.take(n)
	}
	return n, err
}

var _ io.Reader = limitedConn{}

// measure runs one cluster of 1+n nodes and returns the median time of
// o.reps fan-outs to its n receivers.
func measure(o options, n int, relay bool) (time.Duration, error) {
	cfg, err := config.LocalConfig("hosts", 1+n)
	if err != nil {
		return 0, err
	}
	cfg.HeartbeatInterval, cfg.FailureTimeout = 500*time.Millisecond, 20*time.Second
	cfg.Flow.NoRelay, cfg.Flow.RelayMinBytes, cfg.Flow.NoRelayStream = !relay, 1<<20, o.whole
	cfg.Flow.TransferTimeout = o.timeout
	link := &limiter{rate: o.link}
	hostOf := map[string]string{cfg.Nodes[0].Name: "host-a"}
	for _, nc := range cfg.Nodes[1:] {
		hostOf[nc.Name] = "host-b"
	}
	nodes := make([]*actor.Node, len(cfg.Nodes))
	defer func() {
		for _, nd := range nodes {
			if nd != nil {
				_ = nd.Stop()
			}
		}
	}()
	for i, nc := range cfg.Nodes {
		me := nc.Name
		// The staging channel dials the owner to fetch; what it reads
		// from a node of the other host crosses the link.
		limited := func(env *rdma.Env) (rdma.Channel, error) {
			e := *env
			dial := env.Dial
			e.Dial = func(ctx context.Context, node, channel string) (net.Conn, error) {
				c, err := dial(ctx, node, channel)
				if err != nil || hostOf[node] == hostOf[me] {
					return c, err
				}
				return limitedConn{c, link}, nil
			}
			return staging.New(&e)
		}
		nd, err := actor.NewNode(cfg, me, actor.WithHostID(hostOf[me]), actor.WithLogger(zap.NewNop()),
			actor.WithChannel(rdma.Staging, limited),
			actor.WithSystemConfig(pa.WithLoggerFactory(func(*pa.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) })))
		if err != nil {
			return 0, err
		}
		if err := nd.Start(); err != nil {
			return 0, err
		}
		nodes[i] = nd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := nodes[0]
	var sinks []*pa.PID
	for _, nd := range nodes[1:] {
		if err := owner.WaitPeer(ctx, nd.Name()); err != nil {
			return 0, err
		}
		for _, other := range nodes[1:] {
			if other != nd {
				if err := nd.WaitPeer(ctx, other.Name()); err != nil {
					return 0, err
				}
			}
		}
		if _, err := nd.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
			if m, ok := c.Message().(*Weights); ok {
				c.Respond(&Ack{CRC: crc32.ChecksumIEEE(m.W.Host())})
				_ = m.W.Free()
			}
		}), "sink"); err != nil {
			return 0, err
		}
		sinks = append(sinks, owner.PID(nd.Name(), "sink"))
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(o.size)})
	if err != nil {
		return 0, err
	}
	defer x.Free()
	for i := range x.Host() {
		x.Host()[i] = byte(i * 31)
	}
	want := crc32.ChecksumIEEE(x.Host())
	var ds []time.Duration
	for rep := range o.reps + 1 { // the first is not timed
		t0 := time.Now()
		fs := make([]*pa.Future, len(sinks))
		for i, s := range sinks {
			fs[i] = owner.Root().RequestFuture(s, &Weights{W: x}, o.timeout)
		}
		for i, f := range fs {
			res, err := f.Result()
			if a, ok := res.(*Ack); err != nil || !ok || a.CRC != want {
				return 0, fmt.Errorf("receiver %d: %#v, %v", i, res, err)
			}
		}
		if rep > 0 {
			ds = append(ds, time.Since(t0))
		}
		wctx, wcancel := context.WithTimeout(context.Background(), o.timeout)
		err := x.WaitReleased(wctx)
		wcancel()
		if err != nil {
			return 0, err
		}
	}
	return report.Median(ds), nil
}

func printTable(w io.Writer, rs []report.Result) {
	var base float64
	for _, r := range rs {
		if r.Receivers == 1 && r.Path == "hosts-norelay" {
			base = r.Value
		}
	}
	fmt.Fprintf(w, "%9s  %-8s %10s  %s\n", "receivers", "relay", "ms", "× one receiver")
	for _, r := range rs {
		ratio := "-"
		if base > 0 {
			ratio = fmt.Sprintf("%.2f", r.Value/base)
		}
		fmt.Fprintf(w, "%9d  %-8s %10.2f  %s\n", r.Receivers, map[bool]string{true: "on", false: "off"}[r.Path == "hosts-relay"], r.Value/1000, ratio)
	}
}
