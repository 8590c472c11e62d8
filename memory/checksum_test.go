package memory

import (
	"context"
	"hash/crc32"
	"testing"
)

func TestChecksumHost(t *testing.T) {
	data := randomBytes(3<<20+5, 7)
	buf := WrapHost(data)
	got, err := Checksum(context.Background(), buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)); got != want {
		t.Fatalf("Checksum = %#x, want CRC-32C %#x", got, want)
	}
	data[len(data)/2] ^= 1
	if again, _ := Checksum(context.Background(), buf); again == got {
		t.Fatal("a flipped bit left the checksum unchanged")
	}
	if sum, err := Checksum(context.Background(), WrapHost(nil)); sum != 0 || err != nil {
		t.Fatalf("empty buffer: %#x, %v", sum, err)
	}
}

// On a device, Checksum copies through a staging buffer in chunks: a size
// that is not a multiple of the chunk hashes the same as the host bytes.
func TestChecksumCUDA(t *testing.T) {
	needGPU(t)
	ctx := context.Background()
	for _, n := range []int{1, 4096, checksumChunk, 2*checksumChunk + 12345} {
		data := randomBytes(n, uint64(n))
		a, err := AllocatorFor(CUDA(0))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := a.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := Copy(ctx, dev, WrapHost(data)); err != nil {
			t.Fatal(err)
		}
		got, err := Checksum(ctx, dev)
		if err != nil {
			t.Fatal(err)
		}
		if want := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)); got != want {
			t.Errorf("%d bytes on cuda:0: checksum %#x, want %#x", n, got, want)
		}
		_ = dev.Free()
	}
}
