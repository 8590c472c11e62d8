package main

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/rawtcp"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
)

// Paths of the staging mode.
const (
	pathStagingGPU = "tensorferry-staging-gpu"
	pathRawTCP     = "raw-tcp"
	pathNaive      = "naive"
)

func cudaDev(i int) memory.Device { return memory.CUDA(i) }

// runStaging compares the staging channel GPU → GPU with raw TCP from host
// memory and with the naive sequence.
func runStaging(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	p, err := openPair(pairConfig{src: src, dst: dst, disable: []string{rdma.IPC, rdma.Verbs}, timeout: o.timeout})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.close()) }()
	raw, err := rawtcp.Open(rawtcp.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, raw.Close()) }()
	naive, err := newNaive(o.src, o.dst, slices.Max(o.sizes))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, naive.close()) }()
	// The baselines and the messages in passes of their own (as in the
	// ipc mode): the naive sequence's device copies in this process between
	// two messages would make the receiver's copies wait for the GPU to
	// switch contexts.
	rs, err = measure(o, []pathMaker{
		{name: pathRawTCP, make: func(size int) (stepper, error) {
			return &rawStepper{pair: raw, b: make([]byte, size)}, nil
		}},
		{name: pathNaive, make: func(size int) (stepper, error) { return &naiveStepper{n: naive, size: size}, nil }},
	})
	if err != nil {
		return rs, err
	}
	msgs, err := measure(o, []pathMaker{actorPath(pathStagingGPU, p, src)})
	return append(rs, msgs...), err
}

// rawStepper sends host bytes over a raw TCP connection.
type rawStepper struct {
	pair *rawtcp.Pair
	b    []byte
}

func (s *rawStepper) step(bool, bool) (time.Duration, error) { return s.pair.Send(s.b) }
func (s *rawStepper) results(size int, ds []time.Duration) []report.Result {
	return figures(pathRawTCP, size, ds, "")
}
func (s *rawStepper) close() { s.pair.FreeBuffer() }

// naive is the sequence a program without a data channel runs: copy the
// tensor to pageable host memory, send it over TCP, and on the receiving
// side copy it to the device, one after the other.
type naive struct {
	src, dst memory.Buffer // on the two GPUs
	host     []byte
	pair     *rawtcp.Pair
}

func newNaive(srcGPU, dstGPU, n int) (nv *naive, err error) {
	ctx := context.Background()
	nv = &naive{host: make([]byte, n)}
	defer func() {
		if err != nil {
			err = errors.Join(err, nv.close())
		}
	}()
	if nv.src, err = memory.AllocUninit(cudaDev(srcGPU), n); err != nil {
		return nv, err
	}
	if nv.dst, err = memory.AllocUninit(cudaDev(dstGPU), n); err != nil {
		return nv, err
	}
	if err := errors.Join(memory.Fill(ctx, nv.src, 0x5a), memory.Fill(ctx, nv.dst, 0)); err != nil {
		return nv, err
	}
	nv.pair, err = rawtcp.Open(rawtcp.Options{Receive: func(b []byte) error {
		return memory.Copy(ctx, nv.dst, memory.WrapHost(b))
	}})
	return nv, err
}

func (nv *naive) close() error {
	var errs []error
	if nv.pair != nil {
		errs = append(errs, nv.pair.Close())
	}
	for _, b := range []memory.Buffer{nv.src, nv.dst} {
		if b != nil {
			errs = append(errs, b.Free())
		}
	}
	return errors.Join(errs...)
}

type naiveStepper struct {
	n    *naive
	size int
}

func (s *naiveStepper) step(check, _ bool) (time.Duration, error) {
	ctx := context.Background()
	src, err := s.n.src.Slice(0, s.size)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := memory.Copy(ctx, memory.WrapHost(s.n.host[:s.size]), src); err != nil {
		return 0, err
	}
	if _, err := s.n.pair.Send(s.n.host[:s.size]); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if check {
		back := make([]byte, s.size)
		dst, err := s.n.dst.Slice(0, s.size)
		if err != nil {
			return 0, err
		}
		if err := memory.Copy(ctx, memory.WrapHost(back), dst); err != nil {
			return 0, err
		}
		for _, v := range back {
			if v != 0x5a {
				return 0, errors.New("gpu: naive: the destination does not hold the source's bytes")
			}
		}
	}
	return d, nil
}

func (s *naiveStepper) results(size int, ds []time.Duration) []report.Result {
	return figures(pathNaive, size, ds, "")
}
func (s *naiveStepper) close() { s.n.pair.FreeBuffer() }
