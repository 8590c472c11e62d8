package ipc

import (
	"encoding/binary"
	"fmt"
)

// offerLen is the size of an encoded offer: version, allocation id, offset,
// bytes, allocation size, flags, deadline.
const offerLen = 1 + 8 + 8 + 8 + 8 + 1 + 8

const offerVersion = 2

// maxAllocSize bounds the allocation size an offer may name (1 PiB): far
// above any GPU, low enough that offsets and sizes never overflow int64.
const maxAllocSize = 1 << 50

// Offer flags.
const (
	// flagDirect: the holder already maps this allocation (it got the
	// handle in an earlier begin and proved it shares the host), so it may
	// copy under the lease alone, without a begin, finishing before
	// Deadline.
	flagDirect uint8 = 1 << iota

	knownFlags = flagDirect
)

// offer is what Offer puts in a descriptor for the ipc channel: where the
// tensor lies inside the owner's allocation. It grants no access by
// itself: the IPC handle is given only in the answer to a begin request, to
// the export's holder, once that node proved it runs on the owner's host.
// A direct offer only spares a holder that already maps the allocation the
// round trips of begin and end.
type offer struct {
	Alloc     uint64 // memory.Allocation.ID on the owner
	Offset    uint64 // tensor's offset from Allocation.Base
	Bytes     uint64 // tensor's size
	AllocSize uint64 // Allocation.Size
	Flags     uint8
	// Deadline is when the lease ends, in nanoseconds of the host's
	// CLOCK_MONOTONIC (the same in every process of the host); 0: never.
	// A direct copy must be over before it.
	Deadline uint64
}

func (o offer) direct() bool { return o.Flags&flagDirect != 0 }

func (o offer) encode() []byte {
	b := make([]byte, offerLen)
	b[0] = offerVersion
	binary.LittleEndian.PutUint64(b[1:], o.Alloc)
	binary.LittleEndian.PutUint64(b[9:], o.Offset)
	binary.LittleEndian.PutUint64(b[17:], o.Bytes)
	binary.LittleEndian.PutUint64(b[25:], o.AllocSize)
	b[33] = o.Flags
	binary.LittleEndian.PutUint64(b[34:], o.Deadline)
	return b
}

// decodeOffer parses an offer from a descriptor and checks that the tensor
// lies inside the allocation.
func decodeOffer(b []byte) (offer, error) {
	if len(b) != offerLen {
		return offer{}, fmt.Errorf("%w: offer of %d bytes, want %d", errBadMessage, len(b), offerLen)
	}
	if b[0] != offerVersion {
		return offer{}, fmt.Errorf("%w: offer version %d", errBadMessage, b[0])
	}
	o := offer{
		Alloc:     binary.LittleEndian.Uint64(b[1:]),
		Offset:    binary.LittleEndian.Uint64(b[9:]),
		Bytes:     binary.LittleEndian.Uint64(b[17:]),
		AllocSize: binary.LittleEndian.Uint64(b[25:]),
		Flags:     b[33],
		Deadline:  binary.LittleEndian.Uint64(b[34:]),
	}
	if o.AllocSize > maxAllocSize || o.Offset > o.AllocSize || o.Bytes > o.AllocSize-o.Offset {
		return offer{}, fmt.Errorf("%w: offer [%d, +%d) outside an allocation of %d bytes", errBadMessage, o.Offset, o.Bytes, o.AllocSize)
	}
	if o.Flags&^knownFlags != 0 {
		return offer{}, fmt.Errorf("%w: offer flags %#x", errBadMessage, o.Flags)
	}
	return o, nil
}
