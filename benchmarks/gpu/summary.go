package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/benchmarks/internal/size"
)

// summary states issue 4's targets against the figures in rs (and in nccl,
// the output of nccl_sendrecv.py, when given).
func summary(rs, nccl []report.Result) []string {
	find := func(rs []report.Result, match func(string) bool, size int64, metric string) (float64, bool) {
		for _, r := range rs {
			if match(r.Path) && r.Size == size && r.Metric == metric {
				return r.Value, true
			}
		}
		return 0, false
	}
	is := func(p string) func(string) bool { return func(s string) bool { return s == p } }
	// The ipc mode's paths are named for the channel the nodes chose; the
	// stream path is measured the way the ceiling and NCCL are.
	ipcPath := func(s string) bool { return strings.HasPrefix(s, "tensorferry-") && s != pathStagingGPU }
	var ipcPaths []string
	for _, r := range rs {
		if ipcPath(r.Path) && !slices.Contains(ipcPaths, r.Path) {
			ipcPaths = append(ipcPaths, r.Path)
		}
	}
	var out []string
	for _, p := range ipcPaths {
		if v, ok := find(rs, is(p), 256<<20, report.GBps); ok {
			if c, ok := find(rs, is(pathPeer), 256<<20, report.GBps); ok && c > 0 {
				out = append(out, fmt.Sprintf("%s 256MiB: %.1f GB/s = %.1f %% of cuMemcpyPeer's %.1f GB/s (target ≥ 90 %%)", p, v, 100*v/c, c))
			}
		}
		for _, r := range rs {
			if r.Path != p || r.Metric != report.GBps || r.Size < 1<<20 {
				continue
			}
			if n, ok := find(nccl, is("nccl-sendrecv"), r.Size, report.GBps); ok && n > 0 {
				out = append(out, fmt.Sprintf("%s %s: %.1f GB/s vs NCCL %.1f GB/s = %.2f× (target ≥ 1×)", p, size.Format(int(r.Size)), r.Value, n, r.Value/n))
			}
		}
	}
	out = append(out, floorLines(rs)...)
	for _, r := range rs {
		if r.Path != pathStagingGPU || r.Metric != report.GBps || r.Size < 64<<20 {
			continue
		}
		if raw, ok := find(rs, is(pathRawTCP), r.Size, report.GBps); ok && raw > 0 {
			line := fmt.Sprintf("staging %s: %.1f %% of raw TCP (target ≥ 85 %%)", size.Format(int(r.Size)), 100*r.Value/raw)
			if nv, ok := find(rs, is(pathNaive), r.Size, report.GBps); ok && nv > 0 {
				line += fmt.Sprintf(", %.2f× the naive sequence (target ≥ 2×)", r.Value/nv)
			}
			out = append(out, line)
		}
	}
	for _, p := range []string{pathStagingGPU, pathRegH2D} {
		for _, r := range rs {
			if r.Path != p || r.Metric != "first_ms" {
				continue
			}
			if rep, ok := find(rs, is(p), r.Size, "repeat_ms"); ok {
				out = append(out, fmt.Sprintf("%s %s: first %.2f ms, repeated %.2f ms", p, size.Format(int(r.Size)), r.Value, rep))
			}
		}
	}
	return out
}
