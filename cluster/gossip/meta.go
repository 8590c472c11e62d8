package gossip

import (
	"errors"
	"fmt"

	"github.com/hashicorp/memberlist"
	"github.com/tinylib/msgp/msgp"

	"github.com/tensorferry/tensorferry/config"
)

// metaVersion is the first element of the node meta array; a node whose
// meta starts with another is refused.
const metaVersion = 1

// metaFields is the number of elements of a version-1 meta array: version,
// incarnation, address, data address, flags. The flags may be left out (an
// array of 4); later versions may append more elements, which a decoder
// skips.
const (
	metaFields    = 5
	minMetaFields = 4
)

// metaLeaving is the flag of a node that is leaving gracefully: its Leave
// that follows is "left", not a failure.
const metaLeaving = 1 << 0

// maxMetaFields bounds the elements a decoder walks through.
const maxMetaFields = 16

// nodeMeta is what a node publishes in memberlist's node meta: what
// memberlist does not know about it.
type nodeMeta struct {
	Incarnation uint64
	Address     string
	DataAddress string
	Leaving     bool
}

// appendMeta appends m to b as a msgpack array [1, incarnation, address,
// data address, flags].
func appendMeta(b []byte, m nodeMeta) []byte {
	var flags uint8
	if m.Leaving {
		flags |= metaLeaving
	}
	b = msgp.AppendArrayHeader(b, metaFields)
	b = msgp.AppendUint8(b, metaVersion)
	b = msgp.AppendUint64(b, m.Incarnation)
	b = msgp.AppendString(b, m.Address)
	b = msgp.AppendString(b, m.DataAddress)
	return msgp.AppendUint8(b, flags)
}

// errMeta is wrapped by every error decodeMeta returns.
var errMeta = errors.New("gossip: bad node meta")

// decodeMeta decodes a peer's node meta. It is hostile-input safe: at most
// memberlist.MetaMaxSize bytes are read, strings are only allocated for
// bytes that are there, and the addresses must pass config.CheckAddress.
func decodeMeta(b []byte) (nodeMeta, error) {
	var m nodeMeta
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", errMeta)
	}
	if len(b) > memberlist.MetaMaxSize {
		return m, fmt.Errorf("%w: %d bytes, more than %d", errMeta, len(b), memberlist.MetaMaxSize)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return m, fmt.Errorf("%w: %w", errMeta, err)
	}
	if n < minMetaFields || n > maxMetaFields {
		return m, fmt.Errorf("%w: %d fields, want %d..%d", errMeta, n, minMetaFields, maxMetaFields)
	}
	v, b, err := msgp.ReadUint8Bytes(b)
	if err != nil {
		return m, fmt.Errorf("%w: version: %w", errMeta, err)
	}
	if v != metaVersion {
		return m, fmt.Errorf("%w: version %d, want %d", errMeta, v, metaVersion)
	}
	if m.Incarnation, b, err = msgp.ReadUint64Bytes(b); err != nil {
		return m, fmt.Errorf("%w: incarnation: %w", errMeta, err)
	}
	if m.Address, b, err = msgp.ReadStringBytes(b); err != nil {
		return m, fmt.Errorf("%w: address: %w", errMeta, err)
	}
	if m.DataAddress, b, err = msgp.ReadStringBytes(b); err != nil {
		return m, fmt.Errorf("%w: data address: %w", errMeta, err)
	}
	if n >= metaFields {
		var flags uint8
		if flags, b, err = msgp.ReadUint8Bytes(b); err != nil {
			return m, fmt.Errorf("%w: flags: %w", errMeta, err)
		}
		m.Leaving = flags&metaLeaving != 0
	}
	for i := uint32(metaFields); i < n; i++ {
		if b, err = msgp.Skip(b); err != nil {
			return m, fmt.Errorf("%w: field %d: %w", errMeta, i, err)
		}
	}
	if len(b) != 0 {
		return m, fmt.Errorf("%w: %d bytes after the fields", errMeta, len(b))
	}
	if err := config.CheckAddress(m.Address); err != nil {
		return m, fmt.Errorf("%w: address: %w", errMeta, err)
	}
	if err := config.CheckAddress(m.DataAddress); err != nil {
		return m, fmt.Errorf("%w: data address: %w", errMeta, err)
	}
	return m, nil
}
