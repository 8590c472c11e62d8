package main

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"time"

	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/rawtcp"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// warmups is the number of untimed messages per size and path; the first
// one of tensorferry is checked byte for byte (CRC-32) by the receiver.
const warmups = 2

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
	var raw *rawtcp.Pair
	if want(pathRaw) {
		if raw, err = rawtcp.Open(nil); err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, raw.Close()) }()
	}
	if !want(pathTF) {
		n = nil // only for the round trips
	}
	for _, size := range o.sizes {
		if err := measureSize(n, raw, size, repsFor(o, size), add); err != nil {
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

// measureSize times messages of size bytes on each path that is not nil,
// alternating the paths message by message.
func measureSize(n *nodes, raw *rawtcp.Pair, size, reps int, add func(report.Result)) error {
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return err
	}
	defer func() {
		_ = x.Free()
		if raw != nil {
			raw.FreeBuffer()
		}
		debug.FreeOSMemory() // a 1 GiB size leaves GiBs behind
	}()
	fill(x.Host(), uint64(size))
	sum := crc32.ChecksumIEEE(x.Host())

	var tfTimes, rawTimes []time.Duration
	var before, after tfactor.ChannelStats
	for i := range warmups + reps {
		timed := i >= warmups
		if raw != nil {
			d, err := raw.Send(x.Host())
			if err != nil {
				return fmt.Errorf("%s %d bytes: %w", pathRaw, size, err)
			}
			if timed {
				rawTimes = append(rawTimes, d)
			}
		}
		if n != nil {
			if i == warmups {
				before = n.fetched()
			}
			d, err := n.send(x, i == 0, sum)
			if err != nil {
				return err
			}
			if timed {
				tfTimes = append(tfTimes, d)
			}
		}
	}
	if raw != nil {
		add(bandwidth(pathRaw, size, rawTimes, ""))
		add(latency(pathRaw, size, rawTimes, ""))
	}
	if n != nil {
		after = n.fetched()
		ch := "staging"
		if after.Transfers == before.Transfers {
			ch = "inline" // copied into the control frame: no channel fetch
		}
		add(bandwidth(pathTF, size, tfTimes, ch))
		add(latency(pathTF, size, tfTimes, ch))
		if db, dt := after.Bytes-before.Bytes, after.Time-before.Time; db > 0 && dt > 0 {
			add(report.Result{Bench: "transfer", Path: pathTF, Size: int64(size), Metric: "fetch_gbps",
				Value: report.Bandwidth(db, dt), N: int(after.Transfers - before.Transfers), Channel: ch})
		}
	}
	return nil
}

func bandwidth(path string, size int, ds []time.Duration, ch string) report.Result {
	return report.Result{Bench: "transfer", Path: path, Size: int64(size), Metric: report.GBps,
		Value: report.Bandwidth(int64(size), report.Median(ds)), N: len(ds), Channel: ch}
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

// fill writes pseudo-random bytes seeded by seed into b.
func fill(b []byte, seed uint64) {
	var key [32]byte
	key[0] = byte(seed)
	key[1] = byte(seed >> 8)
	key[2] = byte(seed >> 16)
	key[3] = byte(seed >> 24)
	_, _ = rand.NewChaCha8(key).Read(b)
}
