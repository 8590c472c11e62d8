//go:build linux

package shm

import (
	"errors"
	"testing"
)

// FuzzRingIndices: whatever index words the peer writes, an end either
// gets ErrCorrupt or a count within the ring, and copies within it.
func FuzzRingIndices(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint16(10), uint16(5))
	f.Add(uint64(MinRingSize+1), uint64(3), uint16(0), uint16(0))
	f.Add(^uint64(0), ^uint64(0), uint16(4000), uint16(4000))
	mem := anonRegion(f, MinRingSize)
	f.Fuzz(func(t *testing.T, tail, head uint64, wrote, readN uint16) {
		clear(mem)
		p, c := newRing(mem, 0, MinRingSize), newRing(mem, 0, MinRingSize)
		buf := make([]byte, MinRingSize)
		// Some honest traffic first, then the peer's garbage.
		free, _ := p.writable()
		p.write(buf[:min(int(wrote), MinRingSize)], free)
		n, _ := c.readable()
		c.read(buf[:min(int(readN), MinRingSize)], n)
		p.tail.Store(tail)
		if n, err := c.readable(); err == nil {
			if n > MinRingSize {
				t.Fatalf("readable %d", n)
			}
			c.read(buf, n)
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
		p.tail.Store(p.pos)
		c.head.Store(head)
		if n, err := p.writable(); err == nil {
			if n > MinRingSize {
				t.Fatalf("writable %d", n)
			}
			p.write(buf, n)
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
	})
}
