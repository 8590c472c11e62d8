package actor

import (
	"sync"
	"testing"
)

// TestMessageQueueFIFO: every producer's values come out in its order,
// none lost, while the consumer drains concurrently.
func TestMessageQueueFIFO(t *testing.T) {
	var q messageQueue
	const producers, each = 4, 20000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				q.push([2]int{p, i})
			}
		})
	}
	next := make([]int, producers)
	got := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for got < producers*each {
		v := q.pop()
		if v == nil {
			select {
			case <-done:
				if v = q.pop(); v == nil {
					t.Fatalf("queue empty after %d of %d values", got, producers*each)
				}
			default:
				continue
			}
		}
		pi := v.([2]int)
		if pi[1] != next[pi[0]] {
			t.Fatalf("producer %d: got %d, want %d", pi[0], pi[1], next[pi[0]])
		}
		next[pi[0]]++
		got++
	}
	if q.pop() != nil {
		t.Fatal("a value beyond those pushed")
	}
	if cap(q.out) > maxIdleQueue && q.next == len(q.out) {
		q.pop()
		if cap(q.out) > maxIdleQueue {
			t.Fatalf("an emptied queue keeps %d slots", cap(q.out))
		}
	}
}
