package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
)

// Paths of the regcache mode.
const pathRegH2D = "regcache-h2d"

// regRepeats is the number of repeated transfers after the first.
const regRepeats = 5

// runRegCache times the first and the repeated transfers of one buffer.
func runRegCache(o options) ([]report.Result, error) {
	rs, err := firstStaging(o)
	if err != nil {
		return rs, err
	}
	more, err := hostRegistration(o)
	return append(rs, more...), err
}

// firstStaging sends one tensor of o.regSize through the staging channel
// on fresh nodes, then again: the first transfer dials the data connection
// and allocates both ends' pinned rings, the others reuse them.
func firstStaging(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	p, err := openPair(pairConfig{src: src, dst: dst, disable: []string{rdma.IPC, rdma.Verbs}, timeout: o.timeout})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.close()) }()
	x, sum, err := newTensor(src, o.regSize, 7)
	if err != nil {
		return nil, err
	}
	defer x.Free()
	var ds []time.Duration
	ch := ""
	for i := range 1 + regRepeats {
		d, ack, err := p.send(x, i == 0, sum)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
		ch = ack.Channel
	}
	size := int64(o.regSize)
	first, repeat := ds[0], report.Median(ds[1:])
	for _, r := range []report.Result{
		{Bench: "gpu", Path: pathStagingGPU, Size: size, Metric: "first_ms", Value: ms(first), N: 1, Channel: ch},
		{Bench: "gpu", Path: pathStagingGPU, Size: size, Metric: "repeat_ms", Value: ms(repeat), N: regRepeats, Channel: ch},
	} {
		rs = append(rs, o.emit(r))
	}
	return rs, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// hostRegistration copies one pageable host buffer of o.regSize to the GPU
// through a memory.RegCache: the first copy registers the buffer
// (cuMemHostRegister), the repeated ones find it registered.
func hostRegistration(o options) (rs []report.Result, err error) {
	reg, err := memory.NewHostRegistrar()
	if err != nil {
		return nil, err
	}
	cache := memory.NewRegCache("bench-gpu", reg, memory.RegBudget{})
	defer func() { err = errors.Join(err, cache.Close()) }()
	ctx, dev := context.Background(), cudaDev(o.src)
	n := o.regSize
	dbuf, err := memory.AllocUninit(dev, n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, dbuf.Free()) }()
	s, err := memory.NewStream(dev)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	buf, err := memory.NewHostBuffer(n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, buf.Free()) }()
	fill(buf.Host(), 11)
	// A second buffer that is never registered: the pageable baseline.
	plain, err := memory.NewHostBuffer(n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, plain.Free()) }()
	fill(plain.Host(), 12)

	var copies, gets []time.Duration
	for range 1 + regRepeats {
		t0 := time.Now()
		_, release, err := cache.Get(buf.Allocation(), "")
		if err != nil {
			return nil, err
		}
		t1 := time.Now()
		// Ordinary host memory: CopyAsync queues the copy and waits for it in
		// one driver call, which finds the range registered.
		err = s.CopyAsync(dbuf, buf)
		if err == nil {
			err = s.Synchronize()
		}
		release()
		if err != nil {
			return nil, err
		}
		gets = append(gets, t1.Sub(t0))
		copies = append(copies, time.Since(t0))
	}
	var pageable []time.Duration
	for range 1 + regRepeats {
		t0 := time.Now()
		if err := memory.Copy(ctx, dbuf, plain); err != nil {
			return nil, err
		}
		pageable = append(pageable, time.Since(t0))
	}
	st := cache.Stats()
	if st.Misses != 1 || st.Hits != regRepeats {
		return nil, fmt.Errorf("gpu: regcache: %d misses and %d hits, want 1 and %d", st.Misses, st.Hits, regRepeats)
	}
	size := int64(n)
	for _, r := range []report.Result{
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "first_ms", Value: ms(copies[0]), N: 1},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "repeat_ms", Value: ms(report.Median(copies[1:])), N: regRepeats},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "register_ms", Value: ms(gets[0]), N: 1},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "hit_us", Value: report.Us(report.Median(gets[1:])), N: regRepeats},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "pageable_ms", Value: ms(report.Median(pageable)), N: len(pageable)},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: report.GBps, Value: report.Bandwidth(size, report.Median(copies[1:])), N: regRepeats},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "hits", Value: float64(st.Hits)},
		{Bench: "gpu", Path: pathRegH2D, Size: size, Metric: "misses", Value: float64(st.Misses)},
	} {
		rs = append(rs, o.emit(r))
	}
	return rs, nil
}
