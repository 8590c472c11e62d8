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

// Freed large uninitialized host buffers are reused; small ones and
// zeroed ones are not.
func TestHostCacheReuse(t *testing.T) {
	b, err := memory.NewHostBufferUninit(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	_, hits0 := memory.HostCacheStats()
	b.Host()[0] = 42
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	c, err := memory.NewHostBufferUninit(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	if _, hits := memory.HostCacheStats(); hits != hits0+1 {
		t.Fatalf("hits %d, want %d", hits, hits0+1)
	}
	if c.Ptr()%memory.HostAlign != 0 || c.Len() != 3<<20 {
		t.Fatalf("ptr %#x len %d", c.Ptr(), c.Len())
	}
	z, err := memory.NewHostBuffer(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Free()
	for _, v := range z.Host()[:4096] {
		if v != 0 {
			t.Fatal("NewHostBuffer returned non-zero memory")
		}
	}
}
