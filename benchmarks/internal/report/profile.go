package report

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
)

// StartCPUProfile profiles the process into the file at path until the
// returned stop is called (stop reports a failure to close the file on
// stderr). A program that may leave through os.Exit calls
// pprof.StopCPUProfile first, which flushes the profile.
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "profile %s: %v\n", path, err)
		}
	}, nil
}

// StartTrace writes an execution trace (runtime/trace) of the process to
// the file at path until the returned stop is called.
func StartTrace(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		trace.Stop()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "trace %s: %v\n", path, err)
		}
	}, nil
}

// StartMutexProfile records every contended mutex of the process (the
// time goroutines waited on sync.Mutex, sync.RWMutex and the runtime's
// locks, by the stack that released them) until the returned stop is
// called, which writes the profile to the file at path (go tool pprof
// reads it).
func StartMutexProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	prev := runtime.SetMutexProfileFraction(1)
	return func() {
		runtime.SetMutexProfileFraction(prev)
		err := pprof.Lookup("mutex").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "mutex profile %s: %v\n", path, err)
		}
	}, nil
}
