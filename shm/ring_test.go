//go:build linux

package shm

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// anonRegion maps an anonymous shared region for rings of size bytes.
func anonRegion(t testing.TB, size uint32) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, regionSize(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

// ringPair returns the producer's and the consumer's ends of ring 0.
func ringPair(t testing.TB, size uint32) (prod, cons *ring) {
	mem := anonRegion(t, size)
	return newRing(mem, 0, size), newRing(mem, 0, size)
}

func TestRingEmptyFullWraparound(t *testing.T) {
	const size = MinRingSize
	p, c := ringPair(t, size)
	if n, err := c.readable(); n != 0 || err != nil {
		t.Fatalf("empty ring: readable %d, %v", n, err)
	}
	if n, err := p.writable(); n != size || err != nil {
		t.Fatalf("empty ring: writable %d, %v", n, err)
	}
	// Fill it, in two writes.
	src := make([]byte, size+100)
	for i := range src {
		src[i] = byte(i * 7)
	}
	if n := p.write(src[:1000], size); n != 1000 {
		t.Fatalf("wrote %d", n)
	}
	free, _ := p.writable()
	if n := p.write(src[1000:], free); n != size-1000 {
		t.Fatalf("wrote %d, want %d (the rest of the room)", n, size-1000)
	}
	if free, err := p.writable(); free != 0 || err != nil {
		t.Fatalf("full ring: writable %d, %v", free, err)
	}
	// Read part, write across the end (wraparound), read everything.
	got := make([]byte, 0, 2*size)
	buf := make([]byte, 3000)
	avail, _ := c.readable()
	got = append(got, buf[:c.read(buf, avail)]...)
	free, _ = p.writable()
	if free != 3000 {
		t.Fatalf("writable %d after reading 3000", free)
	}
	wrap := bytes.Repeat([]byte{0xee}, 2500)
	if n := p.write(wrap, free); n != 2500 {
		t.Fatalf("wrote %d", n)
	}
	for {
		avail, err := c.readable()
		if err != nil {
			t.Fatal(err)
		}
		if avail == 0 {
			break
		}
		got = append(got, buf[:c.read(buf, avail)]...)
	}
	want := append(append([]byte(nil), src[:size]...), wrap...)
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes differing from the %d written", len(got), len(want))
	}
}

func TestRingCorruptIndices(t *testing.T) {
	const size = MinRingSize
	for _, tc := range []struct {
		name string
		bad  func(p, c *ring) error // corrupts as the peer would; returns the checked end's error
	}{
		{"tail more than a ring ahead", func(p, c *ring) error { p.tail.Store(size + 1); _, err := c.readable(); return err }},
		{"tail behind head", func(p, c *ring) error {
			p.write(make([]byte, 100), 100)
			buf := make([]byte, 100)
			n, _ := c.readable()
			c.read(buf, n)
			p.tail.Store(50)
			_, err := c.readable()
			return err
		}},
		{"tail went back", func(p, c *ring) error {
			p.write(make([]byte, 100), 100)
			c.readable() // sees 100
			p.tail.Store(60)
			_, err := c.readable()
			return err
		}},
		{"tail at max uint64", func(p, c *ring) error { p.tail.Store(^uint64(0)); _, err := c.readable(); return err }},
		{"head past tail", func(p, c *ring) error { c.head.Store(1); _, err := p.writable(); return err }},
		{"head went back", func(p, c *ring) error {
			p.write(make([]byte, 100), 100)
			c.head.Store(80)
			p.writable()
			c.head.Store(20)
			_, err := p.writable()
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := ringPair(t, size)
			if err := tc.bad(p, c); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	page := make([]byte, pageSize)
	h := header{ringSize: DefaultRingSize, nonce: [nonceSize]byte{1, 2, 3}}
	writeHeader(page, h)
	got, err := parseHeader(page)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v; want %+v", got, err, h)
	}
	for _, bad := range []func([]byte){
		func(b []byte) { b[0] = 'x' },
		func(b []byte) { b[hdrVersion] = 9 },
		func(b []byte) { b[hdrRingSize] = 3 },
		func(b []byte) { b[hdrRingSize+3] = 0xff },
	} {
		b := append([]byte(nil), page...)
		bad(b)
		if _, err := parseHeader(b); err == nil {
			t.Errorf("bad header accepted")
		}
	}
	if _, err := parseHeader(page[:10]); err == nil {
		t.Error("short header accepted")
	}
}

// TestRingOrdersForRaceDetector: what a producer wrote before it
// published bytes is seen by the consumer that read them, with no data
// race reported under -race (the index words live outside the memory the
// detector watches: raceReleaseIO, raceAcquireIO).
func TestRingOrdersForRaceDetector(t *testing.T) {
	p, c := ringPair(t, MinRingSize)
	var x int // Go memory, handed over by the ring's bytes alone
	done := make(chan struct{})
	go func() {
		defer close(done)
		x = 42
		if n, err := p.writable(); err != nil || p.write([]byte{1}, n) != 1 {
			t.Errorf("write: %v", err)
		}
	}()
	for {
		n, err := c.readable()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
	}
	if x != 42 {
		t.Fatalf("x = %d after the ring's byte", x)
	}
	<-done
}
