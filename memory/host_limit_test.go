package memory_test

import (
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
)

// A size from the wire larger than the host fails cleanly instead of
// panicking in make or being killed for memory.
func TestHostBufferTooLarge(t *testing.T) {
	for _, n := range []int{1 << 50, 1<<62 - 1} {
		if _, err := memory.NewHostBuffer(n); !errors.Is(err, memory.ErrTooLarge) {
			t.Fatalf("NewHostBuffer(%d) = %v, want ErrTooLarge", n, err)
		}
	}
	b, err := memory.NewHostBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Ptr()%memory.HostAlign != 0 || b.Len() != 1<<20 {
		t.Fatalf("ptr %#x len %d", b.Ptr(), b.Len())
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); !errors.Is(err, memory.ErrFreed) {
		t.Fatalf("second Free = %v", err)
	}
}
