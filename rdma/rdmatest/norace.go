//go:build !race

package rdmatest

const raceEnabled = false
