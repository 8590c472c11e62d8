package cluster

import (
	"sync/atomic"
	"time"
)

// logLimit lets a repeated log line through at most once a second, so that
// a peer that keeps provoking it cannot flood the log. The zero value is
// ready.
type logLimit struct{ last atomic.Int64 } // unix nanoseconds of the last line let through

// Allow reports whether the line may be logged now.
func (l *logLimit) Allow() bool {
	now := time.Now().UnixNano()
	last := l.last.Load()
	return now-last >= int64(time.Second) && l.last.CompareAndSwap(last, now)
}
