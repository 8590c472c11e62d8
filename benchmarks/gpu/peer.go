package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/rawtcp"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
)

// pathPeer is the single-process peer copy, the ceiling of GPU0 → GPU1.
const pathPeer = "cuMemcpyPeer"

// peerBatchBytes is how many bytes one timed batch of peer copies moves
// (at least one copy, at most peerMaxBatch).
const (
	peerBatchBytes = 64 << 20
	peerMaxBatch   = 100
)

// runPeer times cuMemcpyPeerAsync from --src to --dst in this process: a
// batch of memory.Stream.CopyAsync calls between two timing events.
func runPeer(o options) (rs []report.Result, err error) {
	ctx := context.Background()
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	ch := "p2p"
	if ok, err := memory.CanAccessPeer(src, dst); err != nil {
		return nil, err
	} else if ok {
		if err := memory.EnablePeerAccess(src, dst); err != nil {
			return nil, err
		}
	} else {
		ch = "staged-by-driver" // no peer access: the driver copies through the host
	}
	n := slices.Max(o.sizes)
	a, err := memory.AllocUninit(src, n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, a.Free()) }()
	b, err := memory.AllocUninit(dst, n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.Free()) }()
	if err := errors.Join(memory.Fill(ctx, a, 0xa5), memory.Fill(ctx, b, 0)); err != nil {
		return nil, err
	}
	s, err := memory.NewStream(src)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	start, err := memory.NewTimingEvent(src)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, start.Close()) }()
	end, err := memory.NewTimingEvent(src)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, end.Close()) }()

	batchTime := func(size, batch int) (time.Duration, error) {
		from, err := a.Slice(0, size)
		if err != nil {
			return 0, err
		}
		if err := s.Record(start); err != nil {
			return 0, err
		}
		for range batch {
			if err := s.CopyAsync(b, from); err != nil {
				return 0, err
			}
		}
		if err := s.Record(end); err != nil {
			return 0, err
		}
		if err := end.Synchronize(); err != nil {
			return 0, err
		}
		d, err := memory.ElapsedTime(start, end)
		if err != nil {
			return 0, err
		}
		return d / time.Duration(batch), nil
	}
	for _, size := range o.sizes {
		batch := min(peerMaxBatch, max(1, peerBatchBytes/size))
		var ds []time.Duration
		for i := range 2 + repsFor(o, size) {
			d, err := batchTime(size, batch)
			if err != nil {
				return rs, fmt.Errorf("%s %d bytes: %w", pathPeer, size, err)
			}
			if i >= 2 { // two untimed batches first
				ds = append(ds, d)
			}
		}
		for _, r := range figures(pathPeer, size, ds, ch) {
			rs = append(rs, o.emit(r))
		}
	}
	// The copies landed: the last bytes of the largest size are the source's.
	k := min(n, 4096)
	tail, err := b.Slice(n-k, k)
	if err != nil {
		return rs, err
	}
	got := make([]byte, k)
	if err := memory.Copy(ctx, memory.WrapHost(got), tail); err != nil {
		return rs, err
	}
	for _, v := range got {
		if v != 0xa5 {
			return rs, fmt.Errorf("%s: destination holds %#x, want 0xa5", pathPeer, v)
		}
	}
	return rs, nil
}

// pathIPC and pathIPCStream are the ipc mode's paths (one message at a
// time; streamBatch messages in flight) until the channel that carried
// them is known (renamePath).
const (
	pathIPC       = "tensorferry-ipc"
	pathIPCStream = pathIPC + "-stream"
)

// runIPC sends tensor messages from a node on --src to a node of another
// process on --dst (the same GPU or another), over the channel the two
// select, and measures each size's floor in the same run: an in-process
// copy from --src to --dst with its sync, and a raw TCP round trip, first
// alone (the floor), then again beside the messages (for diagnosis: what
// the second process costs them).
func runIPC(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	raw, err := rawtcp.Open(rawtcp.Options{})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, raw.Close()) }()
	alone, err := measure(o, []pathMaker{copySyncPath(pathCopySync, src, dst), rawRTTPath(pathRawRTT, raw)})
	if err != nil {
		return alone, err
	}
	// The stream sends one tensor back to back: with relay the receiving
	// node would fetch it once and copy it for the rest, which times the
	// GPU's memory, not the link. Relay is off here unless --relay-min
	// asks for it.
	pc := pairConfig{src: src, dst: dst, timeout: o.timeout, log: o.logs, readSpin: o.readSpin, relayMin: o.relayMin, noRelay: o.relayMin == 0}
	if o.cpuProfile != "" {
		pc.profile = o.cpuProfile + ".receiver"
	}
	if o.trace != "" {
		pc.trace = o.trace + ".receiver"
	}
	p, err := openPair(pc)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.close()) }()
	// One pass per kind of traffic: measure alternates its paths per
	// repetition, and what one path leaves behind is paid by the next. A
	// stream of up to a thousand messages leaves the receiver releasing
	// leases and collecting garbage while the next lone message arrives;
	// on one GPU a copy by this process between two messages makes each
	// message's copy wait for the GPU to switch contexts (about 165 µs on
	// an H100 without MPS), which the messages alone do not pay.
	rs = alone
	for _, paths := range [][]pathMaker{
		{actorPath(pathIPC, p, src)},
		{streamPath(pathIPCStream, p, src, o.stream)},
		{copySyncPath(pathCopySync+besideSuffix, src, dst), rawRTTPath(pathRawRTT+besideSuffix, raw)},
	} {
		var got []report.Result
		got, err = measure(o, paths)
		rs = append(rs, got...)
		if err != nil {
			break
		}
	}
	for _, old := range []string{pathIPC, pathIPCStream} {
		if name := renamePath(rs, old); name != old {
			o.progressf("gpu: ipc mode: the nodes chose %s, reported as %s", strings.TrimSuffix(name[len("tensorferry-"):], "-stream"), name)
		}
	}
	return withFloors(o, rs), err
}
