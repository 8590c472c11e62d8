package tensor_test

import (
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// Several channels subscribe to export ends; each sees every end, and a
// cancelled subscription sees no more.
func TestStoreOnEndSubscribers(t *testing.T) {
	s := tensor.NewStore("n", 1)
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{8})
	if err != nil {
		t.Fatal(err)
	}
	var a, b int
	cancelA := s.OnEnd(func(*tensor.Export) { a++ })
	s.OnEnd(func(*tensor.Export) { b++ })
	e, d, err := s.Export(x, "peer", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Holder != "peer" {
		t.Fatalf("descriptor holder %q", d.Holder)
	}
	if err := s.Release(e.ID, e.Lease); err != nil {
		t.Fatal(err)
	}
	cancelA()
	if _, _, err := s.Export(x, "peer", 0); err != nil {
		t.Fatal(err)
	}
	s.ReleaseHolder("peer")
	if a != 1 || b != 2 {
		t.Fatalf("a=%d b=%d, want 1 and 2", a, b)
	}
	if x.Leases() != 0 {
		t.Fatalf("%d leases left", x.Leases())
	}
}
