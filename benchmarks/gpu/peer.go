package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/internal/cuda"
)

// pathPeer is the single-process peer copy, the ceiling of GPU0 → GPU1.
const pathPeer = "cuMemcpyPeer"

// peerBatchBytes is how many bytes one timed batch of peer copies moves
// (at least one copy, at most peerMaxBatch).
const (
	peerBatchBytes = 64 << 20
	peerMaxBatch   = 100
)

// runPeer times cuMemcpyPeerAsync from --src to --dst in this process.
func runPeer(o options) (rs []report.Result, err error) {
	c0, err := cuda.Primary(o.src)
	if err != nil {
		return nil, err
	}
	c1, err := cuda.Primary(o.dst)
	if err != nil {
		return nil, err
	}
	ch := "p2p"
	if ok, err := cuda.CanAccessPeer(o.src, o.dst); err != nil {
		return nil, err
	} else if ok {
		if err := errors.Join(c0.EnablePeerAccess(c1), c1.EnablePeerAccess(c0)); err != nil {
			return nil, err
		}
	} else {
		ch = "staged-by-driver" // no peer access: the driver copies through the host
	}
	n := slices.Max(o.sizes)
	a, err := c0.MemAlloc(n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c0.MemFree(a)) }()
	b, err := c1.MemAlloc(n)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c1.MemFree(b)) }()
	if err := errors.Join(c0.MemsetD8(a, 0xa5, n), c1.MemsetD8(b, 0, n)); err != nil {
		return nil, err
	}
	s, err := c0.NewStream()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.Destroy()) }()
	start, err := c0.NewEvent(cuda.EventDefault)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, start.Destroy()) }()
	end, err := c0.NewEvent(cuda.EventDefault)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, end.Destroy()) }()

	batchTime := func(size, batch int) (time.Duration, error) {
		if err := start.Record(s); err != nil {
			return 0, err
		}
		for range batch {
			if err := c0.MemcpyPeerAsync(b, c1, a, c0, size, s); err != nil {
				return 0, err
			}
		}
		if err := end.Record(s); err != nil {
			return 0, err
		}
		if err := end.Synchronize(); err != nil {
			return 0, err
		}
		ms, err := cuda.ElapsedTime(start, end)
		if err != nil {
			return 0, err
		}
		return time.Duration(float64(ms) * 1e6 / float64(batch)), nil
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
	var tail [4096]byte
	k := min(n, len(tail))
	if err := c1.MemcpyDtoH(unsafe.Pointer(&tail[0]), b+cuda.DevicePtr(n-k), k); err != nil {
		return rs, err
	}
	for _, v := range tail[:k] {
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
// process on --dst, over the channel the two select.
func runIPC(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	pc := pairConfig{src: src, dst: dst, timeout: o.timeout, log: o.logs}
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
	rs, err = measure(o, []pathMaker{actorPath(pathIPC, p, src), streamPath(pathIPCStream, p, src, o.stream)})
	for _, old := range []string{pathIPC, pathIPCStream} {
		if name := renamePath(rs, old); name != old {
			o.progressf("gpu: ipc mode: the nodes chose %s, reported as %s", strings.TrimSuffix(name[len("tensorferry-"):], "-stream"), name)
		}
	}
	return rs, err
}
