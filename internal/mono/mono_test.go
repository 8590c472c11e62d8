package mono

import (
	"testing"
	"time"
)

func TestNowAdvancesWithTheClock(t *testing.T) {
	a := Now()
	time.Sleep(time.Millisecond)
	b := Now()
	if a < 0 || b-a < int64(time.Millisecond) {
		t.Fatalf("Now went from %d to %d across a millisecond", a, b)
	}
}
