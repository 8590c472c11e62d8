package transfer

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
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

func encodeTable(entries []entry) ([]byte, error) {
	return wire.EncodeMsgpack(entries)
}

// decodeTable decodes and validates a tensor table. The input is checked
// first (declared lengths within the input, bounded nesting: wire's
// DecodeMsgpack), the count is bounded before anything is allocated for
// it, and every entry must be complete and consistent: a known kind, an
// inline size equal to shape × dtype, a valid descriptor, distinct ids.
func decodeTable(b []byte) ([]entry, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var t table
	if err := wire.DecodeMsgpack(b, &t); err != nil {
		if errors.Is(err, ErrBadTable) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrBadTable, err)
	}
	return t, nil
}

// table is the decoding side of a tensor table.
type table []entry

// DecodeMsgpack implements msgpack.CustomDecoder with the bounds of
// decodeTable.
func (t *table) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 || n > MaxTableEntries {
		return fmt.Errorf("%w: %d entries (at most %d)", ErrBadTable, n, MaxTableEntries)
	}
	// Sized for the common message (bounded, whatever n says); grows
	// with the entries actually decoded.
	out := make([]entry, 0, min(n, 4))
	for i := range n {
		var e entry
		if err := dec.Decode(&e); err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrBadTable, i, err)
		}
		if err := e.validate(); err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrBadTable, i, err)
		}
		if find(out, e.ID) != nil {
			return fmt.Errorf("%w: id %d appears twice", ErrBadTable, e.ID)
		}
		out = append(out, e)
	}
	*t = out
	return nil
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
