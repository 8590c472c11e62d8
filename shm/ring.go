package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/park"
)

// ErrCorrupt is wrapped by the error a Conn returns when the peer left
// index words in the shared region that no correct peer writes: a tail
// behind the data already read or more than a ring ahead of it, a head
// that went back or past what was written. The connection is then of no
// further use; nothing else is affected.
var ErrCorrupt = errors.New("shm: peer corrupted the ring indices")

// ring is one end of one single-producer single-consumer byte ring in the
// shared region: the producer's or the consumer's.
//
// Trust: the peer process can write any word of the region at any time.
// The only words this end reads from the region are the peer's index word
// (the consumer reads tail, the producer reads head) and the waiting flag it
// may have to clear; each index read is checked against this end's own
// copy of its index (never read back from the region) and the ring's
// capacity (fixed when the region was set up, never read again), so a
// garbage index is an error, never an out-of-range copy. The ring's bytes
// are only copied, in or out, with Go's copy; they are parsed by the layer
// above (wire's framer, which bounds every length it reads) from the copy.
// unsafe is used for one thing only: to view the aligned 8- and 4-byte index
// and flag words of the mapping as sync/atomic values.
type ring struct {
	tail     *atomic.Uint64 // written by the producer
	head     *atomic.Uint64 // written by the consumer
	consWait *atomic.Uint32 // set by a consumer about to sleep; cleared by whoever wakes it
	prodWait *atomic.Uint32 // set by a producer about to sleep; cleared by whoever wakes it
	data     []byte
	size     uint64
	mask     uint64

	// This end's own index (the producer's tail or the consumer's head),
	// authoritative, and the last value it saw of the peer's.
	pos, seen uint64
}

// newRing views ring i (0 or 1) of region, whose rings have size bytes.
// The region comes from mmap, so it is page aligned.
func newRing(region []byte, i int, size uint32) *ring {
	ctl := region[ringCtlStart+i*pageSize:]
	data := region[dataOffset+i*int(size):][:size:size]
	return &ring{
		tail:     (*atomic.Uint64)(unsafe.Pointer(&ctl[offTail])),
		head:     (*atomic.Uint64)(unsafe.Pointer(&ctl[offHead])),
		consWait: (*atomic.Uint32)(unsafe.Pointer(&ctl[offConsWait])),
		prodWait: (*atomic.Uint32)(unsafe.Pointer(&ctl[offProdWait])),
		data:     data,
		size:     uint64(size),
		mask:     uint64(size) - 1,
	}
}

// readable returns how many bytes the consumer may read now.
func (r *ring) readable() (uint64, error) {
	tail := r.tail.Load()
	n := tail - r.pos
	// tail may only move forward, and at most one ring ahead of head.
	if n > r.size || n < r.seen-r.pos {
		return 0, fmt.Errorf("%w: tail %d with head %d (last tail %d, ring of %d bytes)", ErrCorrupt, tail, r.pos, r.seen, r.size)
	}
	r.seen = tail
	if n > 0 {
		raceAcquireIO()
	}
	return n, nil
}

// read copies up to len(p) readable bytes (at most n, from readable) out of
// the ring and releases their room to the producer.
func (r *ring) read(p []byte, n uint64) int {
	n = min(n, uint64(len(p)))
	off := r.pos & r.mask
	first := min(n, r.size-off)
	copy(p[:first], r.data[off:off+first])
	copy(p[first:n], r.data[:n-first])
	r.pos += n
	// Published before the producer's waiting flag is looked at
	// (Conn.Read): package park says why it is not a plain Store.
	park.Publish(r.head, r.pos)
	return int(n)
}

// writable returns how many bytes the producer may write now.
func (r *ring) writable() (uint64, error) {
	head := r.head.Load()
	// head may only move forward, and never past tail.
	if head-r.seen > r.pos-r.seen {
		return 0, fmt.Errorf("%w: head %d with tail %d (last head %d, ring of %d bytes)", ErrCorrupt, head, r.pos, r.seen, r.size)
	}
	r.seen = head
	return r.size - (r.pos - head), nil
}

// write copies up to n bytes of p (n from writable) into the ring and
// publishes them to the consumer.
func (r *ring) write(p []byte, n uint64) int {
	n = min(n, uint64(len(p)))
	off := r.pos & r.mask
	first := min(n, r.size-off)
	copy(r.data[off:off+first], p[:first])
	copy(r.data[:n-first], p[first:n])
	r.pos += n
	raceReleaseIO()
	park.Publish(r.tail, r.pos) // before the consumer's flag: see read
	return int(n)
}
