//go:build race

package rdmatest

// raceEnabled reports whether the race detector is on; the 1 GiB case is
// skipped under it (the instrumented fill and compare alone take minutes on
// a 2-core CI machine).
const raceEnabled = true
