package report

import (
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0..100, nearest rank) of ds, or 0
// for none. ds is sorted in place.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(p / 100 * float64(len(ds)))
	return ds[min(max(i, 0), len(ds)-1)]
}

// Median is Percentile(ds, 50).
func Median(ds []time.Duration) time.Duration { return Percentile(ds, 50) }

// Bandwidth returns n bytes per d in GB/s (10^9 bytes per second).
func Bandwidth(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e9
}

// Us returns d in microseconds.
func Us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
