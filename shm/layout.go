package shm

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// The shared region: a header page written once by the creator (the
// acceptor of the connection) before it names the region to the peer, then
// two rings, each with a page of index words (every word on its own cache
// line pair, so the producer's and the consumer's words never share one)
// and its data.
//
//	0            header: magic, version, ring size, creator's nonce, opener's proof
//	pageSize     ring 0 index words (creator → opener)
//	2*pageSize   ring 1 index words (opener → creator)
//	3*pageSize   ring 0 data (ringSize bytes)
//	3*pageSize + ringSize   ring 1 data (ringSize bytes)
const (
	pageSize     = 4096
	headerMagic  = "TFSHMv1\x00"
	layoutVer    = 1
	nonceSize    = 16
	dataOffset   = 3 * pageSize
	lineSize     = 128 // two cache lines: adjacent-line prefetch never couples two words
	offTail      = 0 * lineSize
	offHead      = 1 * lineSize
	offConsWait  = 2 * lineSize
	offProdWait  = 3 * lineSize
	hdrVersion   = 8
	hdrRingSize  = 12
	hdrNonce     = 16
	hdrProof     = hdrNonce + nonceSize
	hdrEnd       = hdrProof + nonceSize
	ringCtlStart = pageSize
)

// Bounds of Config.RingSize.
const (
	// MinRingSize is the smallest ring (bytes per direction).
	MinRingSize = 4 << 10
	// MaxRingSize is the largest ring (bytes per direction).
	MaxRingSize = 64 << 20
	// DefaultRingSize is the ring size (bytes per direction) when
	// Config.RingSize is 0: room for a burst of small frames and a
	// connection's 64 KiB write buffer many times over.
	DefaultRingSize = 1 << 20
)

// namePrefix starts the name of every file a region is made of, followed by
// 32 random hex digits; the memory is the file with suffix ".mem", the four
// doorbells the FIFOs ".b0" to ".b3".
const namePrefix = "tensorferry-shm-"

// regionSize is the size of the shared region for rings of size bytes.
func regionSize(ringSize uint32) int { return dataOffset + 2*int(ringSize) }

// checkRingSize reports whether n is a ring size both ends accept: a power
// of two within [MinRingSize, MaxRingSize].
func checkRingSize(n uint64) error {
	if n < MinRingSize || n > MaxRingSize || n&(n-1) != 0 {
		return fmt.Errorf("shm: ring size %d is not a power of two within [%d, %d]", n, MinRingSize, MaxRingSize)
	}
	return nil
}

// header is the creator's header page, as the opener reads it (a copy:
// nothing is read from the mapping's header again).
type header struct {
	ringSize uint32
	nonce    [nonceSize]byte
}

// writeHeader fills the header page of a new region.
func writeHeader(dst []byte, h header) {
	copy(dst, headerMagic)
	binary.LittleEndian.PutUint32(dst[hdrVersion:], layoutVer)
	binary.LittleEndian.PutUint32(dst[hdrRingSize:], h.ringSize)
	copy(dst[hdrNonce:], h.nonce[:])
}

// parseHeader decodes and checks a header page that a peer wrote. It
// copies what it reads first: the peer may still be writing the page.
func parseHeader(page []byte) (header, error) {
	var b [hdrEnd]byte
	if len(page) < len(b) {
		return header{}, fmt.Errorf("shm: header of %d bytes, want %d", len(page), len(b))
	}
	copy(b[:], page)
	if !bytes.Equal(b[:len(headerMagic)], []byte(headerMagic)) {
		return header{}, fmt.Errorf("shm: region header has magic %q, want %q", b[:len(headerMagic)], headerMagic)
	}
	if v := binary.LittleEndian.Uint32(b[hdrVersion:]); v != layoutVer {
		return header{}, fmt.Errorf("shm: region layout version %d, want %d", v, layoutVer)
	}
	h := header{ringSize: binary.LittleEndian.Uint32(b[hdrRingSize:])}
	if err := checkRingSize(uint64(h.ringSize)); err != nil {
		return header{}, err
	}
	copy(h.nonce[:], b[hdrNonce:])
	return h, nil
}
