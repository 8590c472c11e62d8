// Command traceline merges the execution traces of two processes of one
// host (the `--trace` files of benchmarks/gpu or benchmarks/remote: FILE
// and FILE.receiver) into one timeline, and breaks a repeated round trip
// down into stages.
//
// On Linux a Go execution trace is stamped with CLOCK_MONOTONIC, the same
// clock in every process of a host, so the events of both processes sort
// into one timeline without any alignment.
//
// Timeline: the goroutine events (blocking, syscalls, wake-ups, creation,
// each with the top of its stack) of both processes, S for the sender and
// R for the receiver:
//
//	traceline --sender gpu.trace --receiver gpu.trace.receiver --from 200000 --n 300
//
// Breakdown: --cycle is a regular expression for the event that starts
// each round trip (say, the sender's caller blocking for its reply), each
// --mark NAME=REGEXP the next event of a stage, in order; traceline prints
// the median and 90th percentile of each stage's time from the mark before
// (the cycle's start for the first), over every cycle in which all marks
// were found before the next cycle began:
//
//	traceline --sender s.trace --receiver s.trace.receiver \
//	  --cycle 'S .*Waiting.*actorPair\)\.send\b' \
//	  --mark 'read=R .*syscall end' --mark 'fetch=R .*dtod_async' \
//	  --mark 'ack=R .*syscall\.write' --mark 'wake=S g1 +wake'
//
// The events are the lines of the timeline, matched as printed (without
// the time column).
package main
