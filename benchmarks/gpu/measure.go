package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// warmupsFor returns the number of untimed transfers per path at size: at
// least 2, and up to 500 small ones (64 MiB worth), because a node's first
// few hundred messages run slower than its steady state. The first is
// checked byte for byte where the path can.
func warmupsFor(size int) int { return max(2, min(500, (64<<20)/size)) }

// stepper does one transfer of the size it was made for.
type stepper interface {
	// step does one transfer; check asks for a byte-for-byte check, timed
	// says the transfer counts.
	step(check, timed bool) (time.Duration, error)
	// results turns the timed transfers' durations into figures.
	results(size int, ds []time.Duration) []report.Result
	close()
}

// pathMaker makes a path's stepper for one size.
type pathMaker struct {
	name string
	make func(size int) (stepper, error)
}

// measure times every size on every path, alternating the paths transfer
// by transfer so that a load change touches all of them alike.
func measure(o options, paths []pathMaker) ([]report.Result, error) {
	var rs []report.Result
	for _, size := range o.sizes {
		got, err := measureSize(o, paths, size)
		rs = append(rs, got...)
		debug.FreeOSMemory() // a 1 GiB size leaves GiBs behind
		if err != nil {
			return rs, err
		}
	}
	return rs, nil
}

func measureSize(o options, paths []pathMaker, size int) (rs []report.Result, err error) {
	steppers := make([]stepper, 0, len(paths))
	defer func() {
		for _, s := range steppers {
			s.close()
		}
	}()
	for _, p := range paths {
		s, err := p.make(size)
		if err != nil {
			return nil, fmt.Errorf("%s %d bytes: %w", p.name, size, err)
		}
		steppers = append(steppers, s)
	}
	times := make([][]time.Duration, len(steppers))
	warmups := make([]int, len(steppers))
	most := 0
	for k, s := range steppers {
		warmups[k] = warmupsFor(size)
		if b, ok := s.(interface{ perStep() int }); ok {
			// A step of several messages warms up as many.
			warmups[k] = max(2, warmups[k]/b.perStep())
		}
		most = max(most, warmups[k])
	}
	reps := repsFor(o, size)
	for i := range most + reps {
		for k, s := range steppers {
			if i < most-warmups[k] {
				continue // fewer warm-ups: start later, end together
			}
			timed := i >= most
			d, err := s.step(i == most-warmups[k], timed) // the first is checked
			if err != nil {
				return nil, fmt.Errorf("%s %d bytes: %w", paths[k].name, size, err)
			}
			if timed {
				times[k] = append(times[k], d)
			}
		}
	}
	for k, s := range steppers {
		for _, r := range s.results(size, times[k]) {
			rs = append(rs, o.emit(r))
		}
	}
	return rs, nil
}

// figures returns the gbps and us figures of ds.
func figures(path string, size int, ds []time.Duration, ch string) []report.Result {
	med := report.Median(ds)
	return []report.Result{
		{Bench: "gpu", Path: path, Size: int64(size), Metric: report.GBps, Value: report.Bandwidth(int64(size), med), N: len(ds), Channel: ch},
		{Bench: "gpu", Path: path, Size: int64(size), Metric: report.LatencyUs, Value: report.Us(med), N: len(ds), Channel: ch},
	}
}

// actorStepper sends tensor messages through an actorPair.
type actorStepper struct {
	p        *actorPair
	path     string
	x        *tensor.Tensor
	sum      uint32
	fetch    []time.Duration
	channels map[string]int
}

// actorPath sends tensors on src through p.
func actorPath(name string, p *actorPair, src memory.Device) pathMaker {
	return pathMaker{name: name, make: func(size int) (stepper, error) {
		x, sum, err := newTensor(src, size, uint64(size))
		if err != nil {
			return nil, err
		}
		return &actorStepper{p: p, path: name, x: x, sum: sum, channels: map[string]int{}}, nil
	}}
}

func (s *actorStepper) step(check, timed bool) (time.Duration, error) {
	d, ack, err := s.p.send(s.x, check, s.sum)
	if err != nil {
		return 0, err
	}
	if timed {
		s.channels[ack.Channel]++
		if ack.Channel != "inline" {
			s.fetch = append(s.fetch, ack.Fetch)
		}
	}
	return d, nil
}

func (s *actorStepper) results(size int, ds []time.Duration) []report.Result {
	ch, most := "", 0
	for name, n := range s.channels {
		if n > most {
			ch, most = name, n
		}
	}
	rs := figures(s.path, size, ds, ch)
	if len(s.fetch) > 0 {
		rs = append(rs, report.Result{Bench: "gpu", Path: s.path, Size: int64(size), Metric: "fetch_gbps",
			Value: report.Bandwidth(int64(size), report.Median(s.fetch)), N: len(s.fetch), Channel: ch})
	}
	return rs
}

func (s *actorStepper) close() { _ = s.x.Free() }

// streamBatch is how many messages one step of a stream path sends back to
// back at size: as many as nccl_sendrecv.py's timed iterations (20 from
// 64 MiB, 100 from 1 MiB, 1000 below), so that both pay the same share of
// filling and draining the pipeline.
func streamBatch(size int) int {
	switch {
	case size >= 64<<20:
		return 20
	case size >= 1<<20:
		return 100
	}
	return 1000
}

// streamStepper sends streamBatch messages back to back through an
// actorPair and then waits for all their acks: the figure is the time per
// message, so its bandwidth is measured the way NCCL's and the peer copy's
// are (operations queued back to back, not one round trip at a time).
type streamStepper struct {
	actorStepper
	batch int
}

// streamPath is actorPath with batch messages in flight per step (0:
// streamBatch's count).
func streamPath(name string, p *actorPair, src memory.Device, batch int) pathMaker {
	return pathMaker{name: name, make: func(size int) (stepper, error) {
		x, sum, err := newTensor(src, size, uint64(size))
		if err != nil {
			return nil, err
		}
		n := batch
		if n <= 0 {
			n = streamBatch(size)
		}
		return &streamStepper{actorStepper: actorStepper{p: p, path: name, x: x, sum: sum, channels: map[string]int{}}, batch: n}, nil
	}}
}

func (s *streamStepper) perStep() int { return s.batch }

func (s *streamStepper) step(check, timed bool) (time.Duration, error) {
	d, acks, err := s.p.stream(s.x, s.batch, check, s.sum)
	if err != nil {
		return 0, err
	}
	if timed { // no fetch figure: fetches overlap in a stream
		for _, ack := range acks {
			s.channels[ack.Channel]++
		}
	}
	return d / time.Duration(len(acks)), nil
}

// newTensor returns a tensor of size pseudo-random bytes (seeded by seed) on
// dev, and their CRC-32.
func newTensor(dev memory.Device, size int, seed uint64) (*tensor.Tensor, uint32, error) {
	x, err := tensor.New(dev, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return nil, 0, err
	}
	if dev.IsHost() {
		fill(x.Host(), seed)
		return x, crc32.ChecksumIEEE(x.Host()), nil
	}
	host := make([]byte, size)
	fill(host, seed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := memory.Copy(ctx, x.Buffer(), memory.WrapHost(host)); err != nil {
		return nil, 0, errors.Join(err, x.Free())
	}
	return x, crc32.ChecksumIEEE(host), nil
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

// renamePath gives every result of path old the path "tensorferry-<ch>"
// (followed by old's suffix after pathIPC, e.g. "-stream"), where ch is the
// channel that carried most of its out-of-band sizes, and returns the new
// name.
func renamePath(rs []report.Result, old string) string {
	count := map[string]int{}
	for _, r := range rs {
		if r.Path == old && r.Metric == report.GBps && r.Channel != "inline" && r.Channel != "" {
			count[r.Channel]++
		}
	}
	ch, most := "", 0
	for name, n := range count {
		if n > most || (n == most && name < ch) {
			ch, most = name, n
		}
	}
	if ch == "" {
		return old
	}
	name := "tensorferry-" + ch + strings.TrimPrefix(old, pathIPC)
	for i := range rs {
		if rs[i].Path == old {
			rs[i].Path = name
		}
	}
	return name
}
