package memory

import (
	"context"
	"fmt"
	"hash/crc32"
)

// checksumChunk is the size of the host staging buffer Checksum copies
// device memory through.
const checksumChunk = 8 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of buf's bytes. Host and pinned memory are
// hashed in place; device memory is copied to host memory in chunks of
// 8 MiB first. It reads the whole buffer: a debugging aid, not a hot path.
// CRC-32C catches every change of up to 32 adjacent bits (any one float32
// element written) and misses other changes with probability 2^-32.
func Checksum(ctx context.Context, buf Buffer) (uint32, error) {
	if buf.Len() == 0 {
		return 0, nil
	}
	if buf.Device().IsHost() {
		b := buf.Host()
		if b == nil {
			return 0, ErrFreed
		}
		return crc32.Checksum(b, castagnoli), nil
	}
	staging, err := NewHostBufferUninit(min(buf.Len(), checksumChunk))
	if err != nil {
		return 0, err
	}
	defer staging.Free()
	var sum uint32
	for off := 0; off < buf.Len(); off += staging.Len() {
		n := min(staging.Len(), buf.Len()-off)
		src, err := buf.Slice(off, n)
		if err != nil {
			return 0, err
		}
		dst, err := staging.Slice(0, n)
		if err != nil {
			return 0, err
		}
		if err := Copy(ctx, dst, src); err != nil {
			return 0, fmt.Errorf("memory: checksum of %s: %w", buf.Device(), err)
		}
		sum = crc32.Update(sum, castagnoli, dst.Host())
	}
	return sum, nil
}
