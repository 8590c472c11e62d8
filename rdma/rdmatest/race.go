//go:build race

package rdmatest

// raceEnabled reports whether the race detector is on. The 1 GiB case is
// skipped under it unless RDMATEST_1GIB_RACE is set: measured 43 s for that
// case alone on the 2-core development machine (10 s without -race), mostly
// page faults and the instrumented fill and compare.
const raceEnabled = true
