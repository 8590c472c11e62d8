package owner

import "testing"

// With tfdebug, another goroutine's access panics and the owner's does not;
// without it nothing is checked.
func TestCheck(t *testing.T) {
	var g Goroutine
	g.Check() // nobody bound yet
	g.Bind()
	g.Check()
	panicked := make(chan bool)
	go func() {
		defer func() { panicked <- recover() != nil }()
		g.Check()
	}()
	if got := <-panicked; got != Enabled {
		t.Errorf("another goroutine's Check panicked: %v, want %v (tfdebug %v)", got, Enabled, Enabled)
	}
}
