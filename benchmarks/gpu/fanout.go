package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// The fanout mode's paths: one tensor on --src lent at once to --receivers
// actors of one node on --dst, with fan-out by relay on (the node fetches
// the content once and copies it on --dst for the others; streamed, and
// with whole copies under --relay-whole, pushed by the holder under
// --relay-push) and off (each receiver fetches
// from the owner). With --receiver-nodes, the receivers are nodes of their
// own, one process each (the -nodes paths): with relay on, the owner names
// in each descriptor the receiver to fetch from (transfer.PlanRelay), so
// that one fetch crosses into each GPU.
const (
	pathFanoutRelay           = "tensorferry-fanout-relay"
	pathFanoutRelayWhole      = "tensorferry-fanout-relay-whole"
	pathFanoutNoRelay         = "tensorferry-fanout-norelay"
	pathFanoutNodesRelay      = "tensorferry-fanout-nodes-relay"
	pathFanoutNodesRelayWhole = "tensorferry-fanout-nodes-relay-whole"
	pathFanoutRelayPush       = "tensorferry-fanout-relay-push"
	pathFanoutNodesRelayPush  = "tensorferry-fanout-nodes-relay-push"
	pathFanoutNodesNoRelay    = "tensorferry-fanout-nodes-norelay"
)

// runFanout measures the fanout mode: one receiving process per setting
// of relay: pushed (--relay-push), streamed, whole copies (--relay-whole),
// off.
func runFanout(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	var nodes []memory.Device
	for _, g := range o.receiverNodes {
		nodes = append(nodes, cudaDev(g))
	}
	type setting struct {
		path, nodesPath           string
		noRelay, noStream, noPush bool
	}
	var settings []setting
	if o.relayPush {
		settings = append(settings, setting{path: pathFanoutRelayPush, nodesPath: pathFanoutNodesRelayPush})
	}
	settings = append(settings, setting{path: pathFanoutRelay, nodesPath: pathFanoutNodesRelay, noPush: true})
	if o.relayWhole {
		settings = append(settings, setting{path: pathFanoutRelayWhole, nodesPath: pathFanoutNodesRelayWhole, noStream: true, noPush: true})
	}
	settings = append(settings, setting{path: pathFanoutNoRelay, nodesPath: pathFanoutNodesNoRelay, noRelay: true, noPush: true})
	for _, st := range settings {
		path := st.path
		if len(nodes) > 0 {
			path = st.nodesPath
		}
		got, err := measureFanout(o, path, pairConfig{src: src, dst: dst, timeout: o.timeout, log: o.logs,
			readSpin: o.readSpin, sinks: o.receivers, noRelay: st.noRelay, noStream: st.noStream, noPush: st.noPush, copyChunk: o.copyChunk, relayMin: o.relayMin, nodes: nodes, fanout: o.relayFanout,
			profile: receiverFile(o.cpuProfile, path), trace: receiverFile(o.trace, path)})
		rs = append(rs, got...)
		if err != nil {
			return rs, err
		}
	}
	return rs, nil
}

func measureFanout(o options, path string, pc pairConfig) (rs []report.Result, err error) {
	p, err := openPair(pc)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.close()) }()
	return measure(o, []pathMaker{fanoutPath(path, p, pc.src)})
}

// fanoutStepper lends one tensor to every sink of its pair at once.
type fanoutStepper struct {
	p        *actorPair
	path     string
	x        *tensor.Tensor
	sum      uint32
	channels map[string]int
}

func fanoutPath(name string, p *actorPair, src memory.Device) pathMaker {
	return pathMaker{name: name, make: func(size int) (stepper, error) {
		x, sum, err := newTensor(src, size, uint64(size))
		if err != nil {
			return nil, err
		}
		return &fanoutStepper{p: p, path: name, x: x, sum: sum, channels: map[string]int{}}, nil
	}}
}

// step sends x to every sink without waiting between them, every message
// asking for a CRC check when check is set. It returns the time from the
// first RequestFuture until the last Ack (all hold their copy), then waits
// (untimed) until every lease of x is back.
func (s *fanoutStepper) step(check, timed bool) (time.Duration, error) {
	p := s.p
	futures := make([]*pa.Future, len(p.sinks))
	t0 := time.Now()
	for i, sink := range p.sinks {
		futures[i] = p.node.Root().RequestFuture(sink, &Msg{T: s.x, Check: check}, p.timeout)
	}
	var errs []error
	for i, f := range futures {
		res, err := f.Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("gpu: %v: receiver %d: %w", s.x, i, err))
			continue
		}
		ack, ok := res.(*Ack)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("gpu: %v: reply %T %v", s.x, res, res))
		case ack.Err != "":
			errs = append(errs, fmt.Errorf("gpu: %v: receiver %d: %s", s.x, i, ack.Err))
		case ack.Bytes != s.x.ByteSize():
			errs = append(errs, fmt.Errorf("gpu: %v: receiver %d got %d bytes", s.x, i, ack.Bytes))
		case check && ack.CRC != s.sum:
			errs = append(errs, fmt.Errorf("gpu: %v: receiver %d's CRC-32 %08x, sent %08x", s.x, i, ack.CRC, s.sum))
		case timed:
			s.channels[ack.Channel]++
		}
	}
	d := time.Since(t0)
	wctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	if err := s.x.WaitReleased(wctx); err != nil {
		errs = append(errs, fmt.Errorf("gpu: %v: leases not released: %w", s.x, err))
	}
	return d, errors.Join(errs...)
}

// results: the time until every receiver holds its copy (us), and gbps,
// the bytes delivered in all (size × receivers) over it.
func (s *fanoutStepper) results(size int, ds []time.Duration) []report.Result {
	ch, most := "", 0
	for name, n := range s.channels {
		if n > most {
			ch, most = name, n
		}
	}
	med := report.Median(ds)
	n := int64(len(s.p.sinks))
	return []report.Result{
		{Bench: "gpu", Path: s.path, Size: int64(size), Metric: report.GBps, Value: report.Bandwidth(n*int64(size), med), N: len(ds), Channel: ch, Receivers: int(n)},
		{Bench: "gpu", Path: s.path, Size: int64(size), Metric: report.LatencyUs, Value: report.Us(med), N: len(ds), Channel: ch, Receivers: int(n)},
	}
}

func (s *fanoutStepper) close() { _ = s.x.Free() }

// receiverFile is where a receiving process of path writes what the
// sending one writes to name ("": nothing).
func receiverFile(name, path string) string {
	if name == "" {
		return ""
	}
	return name + "." + path + ".receiver"
}
