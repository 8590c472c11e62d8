package rdmatest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/tensorferry/tensorferry/memory"
)

// Poison is the byte every destination is filled with before a transfer.
const Poison = 0xA5

// Fill writes the pseudo-random stream of seed into p. The stream does not
// depend on how it is cut: Fill of a long slice equals Stream(seed) read in
// pieces.
func Fill(seed uint64, p []byte) { _, _ = Stream(seed).Read(p) }

// Stream returns the generator behind Fill, for producing or checking large
// data a piece at a time.
func Stream(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	copy(s[8:], "tensorferry rdmatest data")
	return rand.NewChaCha8(s)
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
	g := Stream(seed)
	want := make([]byte, min(n, 1<<20))
	for off := 0; off < n; off += len(want) {
		k := min(len(want), n-off)
		_, _ = g.Read(want[:k])
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
