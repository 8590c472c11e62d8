package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/rawtcp"
	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
	"github.com/tensorferry/tensorferry/memory"
)

// The floor of one tensor message (sent → fetched → delivered →
// acknowledged), measured beside it in the ipc mode: the device copy of its
// bytes and one round trip of the transport that carries the message and
// its ack.
const (
	// pathCopySync is an in-process copy of the message's size from
	// --src to --dst (a copy within the GPU when they are one), waited for:
	// one memory.Copy, an async copy and a stream synchronization.
	pathCopySync = "copy+sync"
	// pathRawRTT is a 64-byte round trip over a raw loopback TCP
	// connection in this process: the control transport's floor.
	pathRawRTT = "raw-tcp-rtt"
	// besideSuffix names the same two paths measured again while the
	// receiver process runs (its CUDA context and spinning node share the
	// GPU and the processors): what the messages' neighbourhood costs, for
	// diagnosis only; the floor is measured before that process starts.
	besideSuffix = "-beside"
	// pathFloor is the sum of the two medians, per size.
	pathFloor = "floor"
	// metricXFloor is a message path's median over the floor's.
	metricXFloor = "x_floor"
	// rttBytes is the size of the raw round trip's message.
	rttBytes = 64
)

// copySyncPath copies size bytes from a buffer on src to one on dst; name
// is pathCopySync, with besideSuffix when measured beside the messages.
func copySyncPath(name string, src, dst memory.Device) pathMaker {
	return pathMaker{name: name, make: func(n int) (stepper, error) {
		if src != dst {
			if err := memory.EnablePeerAccess(src, dst); err != nil {
				return nil, err
			}
		}
		a, err := memory.AllocUninit(src, n)
		if err != nil {
			return nil, err
		}
		b, err := memory.AllocUninit(dst, n)
		if err != nil {
			return nil, errors.Join(err, a.Free())
		}
		if err := memory.Fill(context.Background(), a, 0x5a); err != nil {
			return nil, errors.Join(err, a.Free(), b.Free())
		}
		return &copyStepper{name: name, a: a, b: b}, nil
	}}
}

type copyStepper struct {
	name string
	a, b memory.Buffer
}

func (s *copyStepper) step(check, _ bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := memory.Copy(ctx, s.b, s.a); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if check {
		k := min(s.b.Len(), 4096)
		tail, err := s.b.Slice(s.b.Len()-k, k)
		if err != nil {
			return 0, err
		}
		got := make([]byte, k)
		if err := memory.Copy(ctx, memory.WrapHost(got), tail); err != nil {
			return 0, err
		}
		for _, v := range got {
			if v != 0x5a {
				return 0, fmt.Errorf("%s: destination holds %#x, want 0x5a", s.name, v)
			}
		}
	}
	return d, nil
}

func (s *copyStepper) results(n int, ds []time.Duration) []report.Result {
	return figures(s.name, n, ds, "")
}

func (s *copyStepper) close() { _ = errors.Join(s.a.Free(), s.b.Free()) }

// rawRTTPath sends 64 bytes over pair and waits for the ack, whatever the
// size being measured; name is pathRawRTT, with besideSuffix when
// measured beside the messages.
func rawRTTPath(name string, pair *rawtcp.Pair) pathMaker {
	return pathMaker{name: name, make: func(int) (stepper, error) {
		return &rttStepper{name: name, pair: pair, msg: make([]byte, rttBytes)}, nil
	}}
}

type rttStepper struct {
	name string
	pair *rawtcp.Pair
	msg  []byte
}

func (s *rttStepper) step(_, _ bool) (time.Duration, error) { return s.pair.Send(s.msg) }

func (s *rttStepper) results(n int, ds []time.Duration) []report.Result {
	med := report.Median(ds)
	return []report.Result{{Bench: "gpu", Path: s.name, Size: int64(n), Metric: report.LatencyUs, Value: report.Us(med), N: len(ds)}}
}

func (s *rttStepper) close() {}

// withFloors adds, per size, the floor (copy+sync plus the raw round trip)
// and each message path's ratio to it. Stream paths are left out: their
// per-message time overlaps messages.
func withFloors(o options, rs []report.Result) []report.Result {
	us := func(path string, n int64) (float64, bool) {
		for _, r := range rs {
			if r.Path == path && r.Size == n && r.Metric == report.LatencyUs {
				return r.Value, true
			}
		}
		return 0, false
	}
	out := rs
	for _, n := range o.sizes {
		c, ok1 := us(pathCopySync, int64(n))
		t, ok2 := us(pathRawRTT, int64(n))
		if !ok1 || !ok2 {
			continue
		}
		floor := c + t
		out = append(out, o.emit(report.Result{Bench: "gpu", Path: pathFloor, Size: int64(n), Metric: report.LatencyUs, Value: floor}))
		for _, r := range rs {
			if r.Size != int64(n) || r.Metric != report.LatencyUs || !isMessagePath(r.Path) || floor <= 0 {
				continue
			}
			out = append(out, o.emit(report.Result{Bench: "gpu", Path: r.Path, Size: int64(n), Metric: metricXFloor, Value: r.Value / floor, N: r.N, Channel: r.Channel}))
		}
	}
	return out
}

// isMessagePath reports whether path is the ipc mode's one-message-at-a-time
// path (named for the channel the nodes chose).
func isMessagePath(path string) bool {
	return strings.HasPrefix(path, "tensorferry-") && !strings.HasSuffix(path, "-stream") && path != pathStagingGPU
}

// besideOf returns the floor's two parts measured beside the messages at
// size n, if they were.
func besideOf(rs []report.Result, n int64) (copySync, rtt float64, ok bool) {
	var okC, okT bool
	for _, r := range rs {
		if r.Size != n || r.Metric != report.LatencyUs {
			continue
		}
		switch r.Path {
		case pathCopySync + besideSuffix:
			copySync, okC = r.Value, true
		case pathRawRTT + besideSuffix:
			rtt, okT = r.Value, true
		}
	}
	return copySync, rtt, okC && okT
}

// floorLines states the latency target (≤ 2× the floor) per size.
func floorLines(rs []report.Result) []string {
	var out []string
	for _, r := range rs {
		if r.Metric != metricXFloor {
			continue
		}
		for _, f := range rs {
			if f.Path == pathFloor && f.Size == r.Size && f.Metric == report.LatencyUs {
				out = append(out, fmt.Sprintf("%s %s: %.2f× its floor of %.1f µs (copy+sync + raw TCP round trip; target ≤ 2×)",
					r.Path, size.Format(int(r.Size)), r.Value, f.Value))
				if c, t, ok := besideOf(rs, r.Size); ok {
					out = append(out, fmt.Sprintf("  (beside the receiver process the same floor measures %.1f µs: copy+sync %.1f + raw TCP %.1f)", c+t, c, t))
				}
			}
		}
	}
	return out
}
