package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/internal/progress"
)

func main() {
	rttCount := flag.Int("rtt-count", 20000, "timed round trips per path")
	onewayCount := flag.Int("oneway-count", 1000000, "timed one-way messages per path")
	quick := flag.Bool("quick", false, "divide counts by 20")
	asJSON := flag.Bool("json", false, "print one JSON object per figure per line")
	only := flag.String("paths", "", "comma-separated path names to measure (default: all)")
	timeout := flag.Duration("timeout", 2*time.Minute, "how long to wait for one-way messages to arrive")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	mutexProfile := flag.String("mutexprofile", "", "write a profile of the whole run's contended mutexes to this file")
	traceFile := flag.String("trace", "", "write a runtime execution trace of the whole run to this file (go tool trace)")
	showProgress := flag.Bool("progress", false, "print a progress line on stderr even when it is not a terminal")
	interleave := flag.Int("interleave", 0, "open every path at once and time their round trips in this many alternating blocks of rtt-count/interleave each, so that each path's figures come from the same stretch of the run as its floor's (0 or 1: one path after another)")
	flag.Parse()
	for _, prof := range []struct {
		path  string
		start func(string) (func(), error)
	}{{*traceFile, report.StartTrace}, {*cpuProfile, report.StartCPUProfile}, {*mutexProfile, report.StartMutexProfile}} {
		if prof.path == "" {
			continue
		}
		stop, err := prof.start(prof.path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "remote: %v\n", err)
			os.Exit(2)
		}
		defer stop()
		prev := exit // exit stops what was started, then exits
		exit = func(code int) {
			stop()
			prev(code)
		}
	}
	if *quick {
		*rttCount = max(1, *rttCount/20)
		*onewayCount = max(1, *onewayCount/20)
	}

	paths := append([]path{rawTCPPath(), protoRemotePath()}, extraPaths...)
	if *only != "" {
		want := strings.Split(*only, ",")
		paths = slices.DeleteFunc(paths, func(p path) bool { return !slices.Contains(want, p.name) })
		if len(paths) == 0 {
			fmt.Fprintf(os.Stderr, "remote: no path named in --paths=%s\n", *only)
			os.Exit(2)
		}
	}

	prog := progress.New(os.Stderr, *showProgress)
	goroutines := runtime.NumGoroutine()
	var all []result
	failed := false
	if *interleave > 1 {
		rs, err := runInterleaved(paths, *rttCount, *onewayCount, *interleave, *timeout)
		all = append(all, rs...)
		if err != nil {
			fmt.Fprintf(prog.Writer(os.Stderr), "remote: %v\n", err)
			failed = true
		}
	} else {
		for i, p := range paths {
			prog.Phase(i+1, len(paths), p.name, 0)
			rs, err := run(p, *rttCount, *onewayCount, *timeout)
			all = append(all, rs...)
			if err != nil {
				fmt.Fprintf(prog.Writer(os.Stderr), "remote: %s: %v\n", p.name, err)
				failed = true
			}
		}
	}
	prog.Close()
	var err error
	if *asJSON {
		err = writeJSON(os.Stdout, all)
	} else {
		err = writeTable(os.Stdout, all)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "remote: %v\n", err)
		failed = true
	}
	if n := leftover(goroutines, 2*time.Second); n > 0 {
		fmt.Fprintf(os.Stderr, "remote: %d goroutines still running after every path closed\n", n)
		failed = true
	}
	if failed {
		exit(1)
	}
}

// exit runs the deferred profile stop (os.Exit skips deferred calls).
var exit = os.Exit

// run opens p, measures what it offers and closes it.
func run(p path, rttCount, onewayCount int, timeout time.Duration) (rs []result, err error) {
	e, err := p.open()
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer func() {
		if cerr := e.close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	if e.pinger != nil {
		r, err := measureRTT(p.name, e.pinger.RoundTrip, rttCount)
		if err != nil {
			return rs, err
		}
		rs = append(rs, r...)
	}
	if e.sender != nil {
		r, err := measureOneWay(p.name, e.sender, onewayCount, timeout)
		if err != nil {
			return rs, err
		}
		rs = append(rs, r...)
	}
	return rs, nil
}

// runInterleaved opens every path, times their round trips in blocks
// alternating between the paths (rounds blocks of rttCount/rounds round
// trips each, after each path's warm-up), then measures each path's
// one-way rate in turn, and closes them all. Its round-trip figures carry
// the number of rounds (result.Interleave).
func runInterleaved(paths []path, rttCount, onewayCount, rounds int, timeout time.Duration) (rs []result, err error) {
	opened := make([]*endpoints, 0, len(paths))
	defer func() {
		for i, e := range opened {
			if cerr := e.close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("%s: close: %w", paths[i].name, cerr))
			}
		}
	}()
	for _, p := range paths {
		e, err := p.open()
		if err != nil {
			return nil, fmt.Errorf("%s: open: %w", p.name, err)
		}
		opened = append(opened, e)
	}
	samples := make([][]time.Duration, len(paths))
	for i, e := range opened {
		if e.pinger == nil {
			continue
		}
		if err := warmRTT(paths[i].name, e.pinger.RoundTrip, rttCount); err != nil {
			return nil, err
		}
		samples[i] = make([]time.Duration, 0, rttCount)
	}
	block := max(1, rttCount/rounds)
	for r := range rounds {
		for i, e := range opened {
			if e.pinger == nil {
				continue
			}
			n := block
			if r == rounds-1 {
				n = rttCount - len(samples[i]) // the last block takes the rest
			}
			if samples[i], err = timeRTT(paths[i].name, e.pinger.RoundTrip, n, samples[i]); err != nil {
				return nil, err
			}
		}
	}
	for i, e := range opened {
		if e.pinger != nil {
			for _, f := range rttFigures(paths[i].name, samples[i]) {
				f.Interleave = rounds
				rs = append(rs, f)
			}
		}
	}
	for i, e := range opened {
		if e.sender == nil {
			continue
		}
		r, err := measureOneWay(paths[i].name, e.sender, onewayCount, timeout)
		if err != nil {
			return rs, err
		}
		rs = append(rs, r...)
	}
	return rs, nil
}

// leftover waits up to grace for the goroutine count to fall back to base
// and returns how many more are still running.
func leftover(base int, grace time.Duration) int {
	deadline := time.Now().Add(grace)
	for {
		n := runtime.NumGoroutine() - base
		if n <= 0 || time.Now().After(deadline) {
			return max(n, 0)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
