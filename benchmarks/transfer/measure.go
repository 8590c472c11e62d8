package main

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/rawtcp"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// warmupsFor returns the number of untimed messages per path at size: at
// least 2, and up to 500 small ones (64 MiB worth), because a node's first
// few hundred messages run slower than its steady state (about 3× at
// 4 KiB on the development machine). The first message of tensorferry is
// checked byte for byte (CRC-32) by the receiver.
func warmupsFor(size int) int { return max(2, min(500, (64<<20)/size)) }

// verbsWarmups is the number of untimed fetches of the verbs pair paths:
// a channel alone has no node to warm up, and under emulation every fetch
// costs.
const verbsWarmups = 2

// repsFor returns the timed repetitions at size: about 2 GiB per path,
// between 5 and 200 messages, unless o fixes the count.
func repsFor(o options, size int) int {
	if o.reps > 0 {
		return o.reps
	}
	return min(200, max(5, (2<<30)/size))
}

// run measures every size and the round trips, handing each figure to
// progress as it is known, and returns them all.
func run(o options, progress func(report.Result)) (rs []report.Result, err error) {
	add := func(r report.Result) {
		rs = append(rs, r)
		progress(r)
	}
	want := func(p string) bool { return slices.Contains(o.paths, p) }
	var n *nodes
	if want(pathTF) || want("rtt") {
		if n, err = openNodes(o); err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, n.close()) }()
	}
	var raws []rawPath
	for _, p := range []struct {
		name string
		opts rawtcp.Options
	}{{pathRaw, rawtcp.Options{}}, {pathRawFresh, rawtcp.Options{FreshBuffer: true}}} {
		if !want(p.name) {
			continue
		}
		pair, err := rawtcp.Open(p.opts)
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, pair.Close()) }()
		raws = append(raws, rawPath{p.name, pair})
	}
	var pairs []*verbsPair
	for _, p := range []struct {
		name  string
		rails int
	}{{pathVerbs1, 1}, {pathVerbs2, 2}} {
		if !want(p.name) {
			continue
		}
		vp, perr := openVerbsPair(p.name, p.rails, o.nic, o.verbsSrc, o.verbsDst)
		if perr != nil {
			if o.skipVerbs != nil {
				o.skipVerbs(p.name, perr)
				continue
			}
			return nil, perr
		}
		defer func() { err = errors.Join(err, vp.close()) }()
		pairs = append(pairs, vp)
	}
	tf := n
	if !want(pathTF) {
		tf = nil // n is only for the round trips
	}
	for _, size := range o.sizes {
		if err := measureSize(tf, raws, pairs, size, repsFor(o, size), o.timeout, add); err != nil {
			return rs, err
		}
	}
	if want("rtt") {
		if err := measureRTT(n, o.rttCount, add); err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// rawPath is a raw TCP baseline by name.
type rawPath struct {
	name string
	pair *rawtcp.Pair
}

// measureSize times messages of size bytes on n (unless nil), each raw
// path and each verbs pair, alternating the paths message by message.
func measureSize(n *nodes, raws []rawPath, pairs []*verbsPair, size, reps int, timeout time.Duration, add func(report.Result)) error {
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return err
	}
	defer func() {
		_ = x.Free()
		for _, r := range raws {
			r.pair.FreeBuffer()
		}
		debug.FreeOSMemory() // a 1 GiB size leaves GiBs behind
	}()
	fill(x.Host(), uint64(size))
	sum := crc32.ChecksumIEEE(x.Host())
	var vx *verbsBuffers
	if len(pairs) > 0 {
		if vx, err = newVerbsBuffers(x, pairs[0].src, pairs[0].dst); err != nil {
			return err
		}
		defer vx.free()
	}

	rawTimes := make([][]time.Duration, len(raws))
	pairTimes := make([][]time.Duration, len(pairs))
	var tfTimes, fetchTimes []time.Duration
	fetches := 0
	warmups := warmupsFor(size)
	for i := range warmups + reps {
		timed := i >= warmups
		for k, r := range raws {
			d, err := r.pair.Send(x.Host())
			if err != nil {
				return fmt.Errorf("%s %d bytes: %w", r.name, size, err)
			}
			if timed {
				rawTimes[k] = append(rawTimes[k], d)
			}
		}
		for k, p := range pairs {
			if i < warmups-verbsWarmups {
				continue // a channel alone needs few warm-ups
			}
			d, err := p.fetch(vx.src, vx.dst, timeout)
			if err != nil {
				return fmt.Errorf("%s %d bytes: %w", p.name, size, err)
			}
			if i == warmups-verbsWarmups {
				if err := vx.check(sum); err != nil {
					return fmt.Errorf("%s %d bytes: %w", p.name, size, err)
				}
			}
			if timed {
				pairTimes[k] = append(pairTimes[k], d)
			}
		}
		if n == nil {
			continue
		}
		before := n.fetched()
		d, err := n.send(x, i == 0, sum)
		if err != nil {
			return err
		}
		after := n.fetched()
		if timed {
			tfTimes = append(tfTimes, d)
			if after.Transfers > before.Transfers {
				fetches++
				fetchTimes = append(fetchTimes, after.Time-before.Time)
			}
		}
	}
	for k, r := range raws {
		add(bandwidth(r.name, report.GBps, size, rawTimes[k], ""))
		add(best(r.name, size, rawTimes[k], ""))
		add(latency(r.name, size, rawTimes[k], ""))
	}
	for k, p := range pairs {
		add(bandwidth(p.name, report.GBps, size, pairTimes[k], "verbs"))
		add(best(p.name, size, pairTimes[k], "verbs"))
		add(latency(p.name, size, pairTimes[k], "verbs"))
	}
	if n != nil {
		ch := forcedChannel
		if fetches == 0 {
			ch = "inline" // copied into the control frame: no channel fetch
		}
		add(bandwidth(pathTF, report.GBps, size, tfTimes, ch))
		add(best(pathTF, size, tfTimes, ch))
		add(latency(pathTF, size, tfTimes, ch))
		if fetches > 0 {
			add(bandwidth(pathTF, "fetch_gbps", size, fetchTimes, ch))
		}
	}
	return nil
}

func bandwidth(path, metric string, size int, ds []time.Duration, ch string) report.Result {
	return report.Result{Bench: "transfer", Path: path, Size: int64(size), Metric: metric,
		Value: report.Bandwidth(int64(size), report.Median(ds)), N: len(ds), Channel: ch}
}

// metricBest is the bandwidth of the fastest repetition: on a loaded host
// the least disturbed one, closest to what the path can do.
const metricBest = "gbps_best"

func best(path string, size int, ds []time.Duration, ch string) report.Result {
	return report.Result{Bench: "transfer", Path: path, Size: int64(size), Metric: metricBest,
		Value: report.Bandwidth(int64(size), report.Percentile(ds, 0)), N: len(ds), Channel: ch}
}

func latency(path string, size int, ds []time.Duration, ch string) report.Result {
	return report.Result{Bench: "transfer", Path: path, Size: int64(size), Metric: report.LatencyUs,
		Value: report.Us(report.Median(ds)), N: len(ds), Channel: ch}
}

// measureRTT times count round trips of a 64-byte message and of a 4 KiB
// tensor message, alternating, after a warm-up.
func measureRTT(n *nodes, count int, add func(report.Result)) error {
	if count < 1 {
		return errors.New("transfer: rtt count must be positive")
	}
	small := &Small{Payload: make([]byte, rttPayload)}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{rttTensor})
	if err != nil {
		return err
	}
	defer x.Free()
	fill(x.Host(), 1)
	sum := crc32.ChecksumIEEE(x.Host())
	var smallTimes, tensorTimes []time.Duration
	for i := range max(100, count/10) + count {
		timed := i >= max(100, count/10)
		t0 := time.Now()
		if err := n.roundTrip(small); err != nil {
			return err
		}
		if d := time.Since(t0); timed {
			smallTimes = append(smallTimes, d)
		}
		d, err := n.send(x, i == 0, sum)
		if err != nil {
			return err
		}
		if timed {
			tensorTimes = append(tensorTimes, d)
		}
	}
	for _, f := range []struct {
		path string
		size int64
		ds   []time.Duration
	}{{pathRTT64, rttPayload, smallTimes}, {pathRTT4K, rttTensor, tensorTimes}} {
		p50, p99 := report.Median(f.ds), report.Percentile(f.ds, 99)
		add(report.Result{Bench: "transfer", Path: f.path, Size: f.size, Metric: report.RTTP50Us, Value: report.Us(p50), N: count})
		add(report.Result{Bench: "transfer", Path: f.path, Size: f.size, Metric: report.RTTP99Us, Value: report.Us(p99), N: count})
	}
	return nil
}

// fillPeriod is the length of the random block fill repeats: not a
// divisor of any chunk size, so a chunk landing at the wrong offset changes
// the checksum.
const fillPeriod = 1<<20 + 7

// fill writes pseudo-random bytes seeded by seed into b: one random block
// of fillPeriod bytes, repeated (generating GiBs of random bytes would take
// longer than moving them).
func fill(b []byte, seed uint64) {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	block := make([]byte, min(len(b), fillPeriod))
	_, _ = rand.NewChaCha8(key).Read(block)
	for off := 0; off < len(b); {
		off += copy(b[off:], block)
	}
}
