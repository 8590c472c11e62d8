package transfer

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/tinylib/msgp/msgp"
)

// The tensor table travels beside a message's body (wire.Message.Tensors):
// a msgpack array with one entry per tensor or Ref the body refers to, each
// a map {i: WireID, k: kind, ...}: an inline tensor's dtype, shape and
// bytes, or the descriptor of an export.
const (
	entryInline = 1 // t, s, b: the bytes follow
	entryFetch  = 2 // d: fetched before delivery
	entryRef    = 3 // d: delivered as a lazy tensor.Ref
)

// MaxTableEntries bounds the tensors and Refs of one message.
const MaxTableEntries = 1024

// ErrBadTable is wrapped by the errors of a tensor table that cannot be
// decoded or does not match its message's body.
var ErrBadTable = errors.New("transfer: bad tensor table")

type entry struct {
	ID    uint64             `msgpack:"i"`
	Kind  uint8              `msgpack:"k"`
	DType tensor.DType       `msgpack:"t"`
	Shape tensor.Shape       `msgpack:"s"`
	Data  []byte             `msgpack:"b"`
	Desc  *tensor.Descriptor `msgpack:"d"`

	used bool // a field of the body referred to it (decoding side)
}

// maxEntryFields bounds the map entries of one table entry on the wire
// (6 known fields, room for later ones).
const maxEntryFields = 16

// encodeTable encodes a tensor table with msgp's primitives: the bytes
// msgpack's reflection writes for the struct tags of entry.
func encodeTable(entries []entry) ([]byte, error) {
	b := msgp.AppendArrayHeader(nil, uint32(len(entries)))
	var err error
	for i := range entries {
		e := &entries[i]
		b = msgp.AppendMapHeader(b, 6)
		b = msgp.AppendUint64(msgp.AppendString(b, "i"), e.ID)
		b = msgp.AppendUint8(msgp.AppendString(b, "k"), e.Kind)
		b = msgp.AppendUint8(msgp.AppendString(b, "t"), uint8(e.DType))
		if b, err = e.Shape.MarshalMsg(msgp.AppendString(b, "s")); err != nil {
			return nil, err
		}
		b = msgp.AppendString(b, "b")
		if e.Data == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendBytes(b, e.Data)
		}
		b = msgp.AppendString(b, "d")
		if e.Desc == nil {
			b = msgp.AppendNil(b)
		} else if b, err = e.Desc.MarshalMsg(b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// decodeTable decodes and validates a tensor table. The input is checked
// first (one msgpack value, declared lengths and counts within the input,
// bounded nesting: wire.CheckMsgpack), the count is bounded before anything
// is allocated for it, and every entry must be complete and consistent: a
// known kind, an inline size equal to shape × dtype, a valid descriptor,
// distinct ids.
func decodeTable(b []byte) ([]entry, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if err := wire.CheckMsgpack(b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTable, err)
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTable, err)
	}
	if n > MaxTableEntries {
		return nil, fmt.Errorf("%w: %d entries (at most %d)", ErrBadTable, n, MaxTableEntries)
	}
	// Sized for the common message (bounded, whatever n says); grows
	// with the entries actually decoded.
	out := make([]entry, 0, min(n, 4))
	for i := range n {
		var e entry
		if b, err = e.unmarshal(b); err != nil {
			return nil, fmt.Errorf("%w: entry %d: %w", ErrBadTable, i, err)
		}
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("%w: entry %d: %w", ErrBadTable, i, err)
		}
		if find(out, e.ID) != nil {
			return nil, fmt.Errorf("%w: id %d appears twice", ErrBadTable, e.ID)
		}
		out = append(out, e)
	}
	if len(b) != 0 { // CheckMsgpack saw one value: cannot happen
		return nil, fmt.Errorf("%w: %d bytes after the table", ErrBadTable, len(b))
	}
	return out, nil
}

// unmarshal decodes the entry at the start of b and returns the bytes that
// follow. Unknown fields are skipped.
func (e *entry) unmarshal(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, err
	}
	if n > maxEntryFields {
		return nil, fmt.Errorf("%d fields", n)
	}
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return nil, err
		}
		switch string(key) {
		case "i":
			e.ID, b, err = msgp.ReadUint64Bytes(b)
		case "k":
			e.Kind, b, err = msgp.ReadUint8Bytes(b)
		case "t":
			var v uint8
			v, b, err = msgp.ReadUint8Bytes(b)
			e.DType = tensor.DType(v)
		case "s":
			b, err = e.Shape.UnmarshalMsg(b)
		case "b":
			if msgp.IsNil(b) {
				e.Data, b = nil, b[1:]
			} else {
				e.Data, b, err = msgp.ReadBytesBytes(b, nil)
			}
		case "d":
			if msgp.IsNil(b) {
				e.Desc, b = nil, b[1:]
			} else {
				e.Desc = new(tensor.Descriptor)
				b, err = e.Desc.UnmarshalMsg(b)
			}
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", key, err)
		}
	}
	return b, nil
}

func (e *entry) validate() error {
	switch e.Kind {
	case entryInline:
		n, err := e.Shape.ByteSize(e.DType)
		if err != nil {
			return err
		}
		if int64(len(e.Data)) != n {
			return fmt.Errorf("%w: inline %v of %v has %d bytes, want %d", tensor.ErrBadSize, e.Shape, e.DType, len(e.Data), n)
		}
		if e.Desc != nil {
			return errors.New("inline entry with a descriptor")
		}
	case entryFetch, entryRef:
		if e.Desc == nil {
			return errors.New("no descriptor")
		}
		if err := e.Desc.Validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown kind %d", e.Kind)
	}
	return nil
}

// find returns the entry with id, or nil.
func find(entries []entry, id uint64) *entry {
	for i := range entries {
		if entries[i].ID == id {
			return &entries[i]
		}
	}
	return nil
}
