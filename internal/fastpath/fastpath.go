// Package fastpath decides, in one place, whether the control path's fast
// paths whose default depends on the host are on: the read spin of control
// connections (TCP and shared memory; a Request that reads its own reply
// reads through it) and decoding a burst's messages on the actor's
// goroutine (transport.burst_decode). They pay only with
// processors to spare, so by default they are on where the process runs
// with at least MinProcs processors (GOMAXPROCS) and as many CPUs, and off
// below, as on a 2-core CI machine.
//
// The environment variable TENSORFERRY_FASTPATHS=on (Env) turns them all
// on regardless of the host, so that the test suites run on a small
// machine the code that users run on a GPU host (scripts/test runs the
// actor, wire and shm suites a second time with it). It changes only
// defaults: a fast path that the configuration turns off stays off.
// Unset, empty or "auto", the host decides; any other value is refused by
// config.Validate (CheckEnv) and otherwise taken as "auto".
//
//	if fastpath.Spare() { spin = wire.DefaultReadSpin }
package fastpath

import (
	"fmt"
	"os"
	"runtime"
	"sync"
)

// Env is the environment variable that forces the fast paths on: "on".
const Env = "TENSORFERRY_FASTPATHS"

// MinProcs is the fewest processors (GOMAXPROCS, and CPUs to run them) at
// which the fast paths are on by default: below it a spinning reader takes
// a processor that the goroutines it serves need (on a 2-core machine the
// handler, the writer and the actors share two).
const MinProcs = 8

// env is Env's value, parsed once: fast paths are chosen when connections
// and nodes are made, and a process keeps one choice.
var env = sync.OnceValues(func() (bool, error) { return parse(os.Getenv(Env)) })

// parse reads a value of Env: whether it forces the fast paths on.
func parse(v string) (bool, error) {
	switch v {
	case "", "auto":
		return false, nil
	case "on":
		return true, nil
	}
	return false, fmt.Errorf("fastpath: %s=%q: want on or auto", Env, v)
}

// Forced reports whether Env forces the fast paths on.
func Forced() bool {
	on, _ := env()
	return on
}

// CheckEnv returns an error naming Env when its value is neither "on",
// "auto" nor empty.
func CheckEnv() error {
	_, err := env()
	return err
}

// Spare reports whether the fast paths are on by default: Env forces them,
// or the process has at least MinProcs processors and CPUs.
func Spare() bool {
	return Forced() || min(runtime.GOMAXPROCS(0), runtime.NumCPU()) >= MinProcs
}
