package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"
)

// raiseFDLimit raises the soft descriptor limit to the hard one and
// returns it.
func raiseFDLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, err
		}
	}
	return l.Cur, nil
}

// openFDs counts the process's open descriptors.
func openFDs() int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(es)
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapAlloc is the live heap after a collection, in bytes. Two: what
// sync.Pools held survives the first in their victim caches.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// downLog records when each node reported which node down.
type downLog struct {
	mu   sync.Mutex
	recs []downRec
}

type downRec struct {
	at       time.Time
	reporter int
	victim   string
}

func (d *downLog) add(reporter int, victim string) {
	d.mu.Lock()
	d.recs = append(d.recs, downRec{time.Now(), reporter, victim})
	d.mu.Unlock()
}

// count returns how many downs were reported so far.
func (d *downLog) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.recs)
}

// wait waits until every node in reporters reported victim down after
// since, or timeout; it returns each reporter's delay, sorted, and how
// many did not report.
func (d *downLog) wait(victim string, reporters []int, since time.Time, timeout time.Duration) ([]time.Duration, int) {
	deadline := time.Now().Add(timeout)
	for {
		got := map[int]time.Duration{}
		d.mu.Lock()
		for _, r := range d.recs {
			if r.victim == victim && !r.at.Before(since) {
				if _, ok := got[r.reporter]; !ok {
					got[r.reporter] = r.at.Sub(since)
				}
			}
		}
		d.mu.Unlock()
		missing := 0
		for _, r := range reporters {
			if _, ok := got[r]; !ok {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			out := make([]time.Duration, 0, len(got))
			for _, v := range got {
				out = append(out, v)
			}
			slices.Sort(out)
			return out, missing
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// detection summarises detection delays.
type detection struct {
	median, max time.Duration
	missing     int // reporters that did not see it within the timeout
}

func summarise(ds []time.Duration, missing int) detection {
	if len(ds) == 0 {
		return detection{missing: missing}
	}
	return detection{median: ds[len(ds)/2], max: ds[len(ds)-1], missing: missing}
}

// loadAvg is the machine's load average over the last minute.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}
