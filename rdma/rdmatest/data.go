package rdmatest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
)

// Poison is the byte every destination is filled with before a transfer.
const Poison = 0xA5

// Fill writes the first len(p) bytes of seed's pseudo-random stream into p.
func Fill(seed uint64, p []byte) { FillAt(seed, 0, p) }

// FillAt writes bytes [off, off+len(p)) of seed's pseudo-random stream into
// p. The stream is counter-based (splitmix64 of the word index), so any
// piece of it can be produced or checked on its own, by another process too.
func FillAt(seed uint64, off int64, p []byte) {
	i := uint64(off) / 8
	if r := int(uint64(off) % 8); r != 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], word(seed, i))
		n := copy(p, w[r:])
		p = p[n:]
		i++
	}
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, word(seed, i))
		p = p[8:]
		i++
	}
	if len(p) > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], word(seed, i))
		copy(p, w[:])
	}
}

func word(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// allocPoisoned allocates n bytes on dev, all set to Poison.
func allocPoisoned(ctx context.Context, dev memory.Device, n int) (memory.Buffer, error) {
	a, err := memory.AllocatorFor(dev)
	if err != nil {
		return nil, err
	}
	buf, err := a.Alloc(n)
	if err != nil {
		return nil, err
	}
	if h := buf.Host(); h != nil {
		poison(h)
		return buf, nil
	}
	tmp, err := memory.NewHostBuffer(n)
	if err != nil {
		_ = buf.Free()
		return nil, err
	}
	defer tmp.Free()
	poison(tmp.Host())
	if err := memory.Copy(ctx, buf, tmp); err != nil {
		_ = buf.Free()
		return nil, err
	}
	return buf, nil
}

// hostView returns the bytes of buf, copying device memory to the host.
// free gives back the copy, if one was made.
func hostView(ctx context.Context, buf memory.Buffer) (b []byte, free func(), err error) {
	if h := buf.Host(); h != nil || buf.Len() == 0 {
		return h, func() {}, nil
	}
	tmp, err := memory.NewHostBuffer(buf.Len())
	if err != nil {
		return nil, nil, err
	}
	if err := memory.Copy(ctx, tmp, buf); err != nil {
		_ = tmp.Free()
		return nil, nil, err
	}
	return tmp.Host(), func() { _ = tmp.Free() }, nil
}

// verify checks that got holds Fill(seed)'s first n bytes followed by Poison
// only.
func verify(got []byte, seed uint64, n int) error {
	if len(got) < n {
		return fmt.Errorf("destination of %d bytes < %d", len(got), n)
	}
	want := make([]byte, min(n, 1<<20))
	for off := 0; off < n; off += len(want) {
		k := min(len(want), n-off)
		FillAt(seed, int64(off), want[:k])
		if !bytes.Equal(got[off:off+k], want[:k]) {
			for i := range k {
				if got[off+i] != want[i] {
					return fmt.Errorf("byte %d of %d: got %#02x, want %#02x", off+i, n, got[off+i], want[i])
				}
			}
		}
	}
	if tail := got[n:]; bytes.Count(tail, []byte{Poison}) != len(tail) {
		i := 0
		for i < len(tail) && tail[i] == Poison {
			i++
		}
		return fmt.Errorf("the destination past the %d bytes transferred was overwritten (first at byte %d: %#02x)", n, n+i, tail[i])
	}
	return nil
}

// poison fills p with Poison by doubling copies (fast even under -race).
func poison(p []byte) {
	if len(p) == 0 {
		return
	}
	p[0] = Poison
	for i := 1; i < len(p); i *= 2 {
		copy(p[i:], p[:i])
	}
}
