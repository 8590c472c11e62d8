package poll

import (
	"sync/atomic"
	"testing"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 5 {
			n.Add(1)
		}
	}()
	Until(t, "five increments", func() bool { return n.Load() == 5 })
}
