package tensor

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// ErrBadDescriptor is wrapped by every descriptor validation error.
var ErrBadDescriptor = errors.New("tensor: bad descriptor")

// Limits applied to descriptors received from the wire.
const (
	maxOffers     = 8
	maxOfferBytes = 4096
	maxNameLen    = 256
)

// Descriptor names a tensor exported by its owner: what a message carries
// instead of the bytes. The receiver fetches the bytes through a data channel
// and then releases the lease.
type Descriptor struct {
	Owner       string `msgpack:"o"` // owner node name
	Incarnation uint64 `msgpack:"i"` // owner node incarnation; descriptors of an old life are rejected
	ExportID    uint64 `msgpack:"e"` // export id in the owner's Store
	Lease       uint64 `msgpack:"l"` // lease id, unguessable, issued with the export
	DType       DType  `msgpack:"t"`
	Shape       Shape  `msgpack:"s"`
	Bytes       int64  `msgpack:"b"` // must equal Shape × DType size
	Device      string `msgpack:"d"` // owner-side device, e.g. "cuda:0"
	// Holder is the node the lease was issued to. A node that fetches a
	// descriptor it did not get from the owner (a forwarded Ref) is not the
	// holder: channels that bind access to the holder (ipc, verbs) then
	// give way to staging.
	Holder string `msgpack:"h,omitempty"`
	// Offers holds what the owner offers each data channel, keyed by channel
	// name (for example the CUDA IPC handle for "ipc").
	Offers map[string][]byte `msgpack:"f,omitempty"`
	// Content names the bytes: descriptors of one owner and incarnation
	// with the same nonzero Content lend the same bytes (the owner cannot
	// write a lent tensor, and a tensor lent again after all its leases
	// ended gets a new Content). A receiving node that fetches one of them
	// may copy the others from its first copy (fan-out by relay).
	Content uint64 `msgpack:"c,omitempty"`
	// Relay names the receiver of the same content to ask first: the
	// owner lends the content to several nodes and plans which of them
	// serves which (transfer's fan-out by relay). It is only a hint: a
	// receiver that cannot get the bytes from there fetches them from the
	// owner. Empty: from the owner.
	Relay string `msgpack:"r,omitempty"`
}

// Validate checks that the descriptor is well formed: a known dtype, a valid
// shape, a byte size equal to shape × dtype size, a parsable device, and
// bounded offers.
func (d *Descriptor) Validate() error {
	if d == nil {
		return fmt.Errorf("%w: nil", ErrBadDescriptor)
	}
	if d.Owner == "" || len(d.Owner) > maxNameLen {
		return fmt.Errorf("%w: owner name %q", ErrBadDescriptor, d.Owner)
	}
	if len(d.Holder) > maxNameLen {
		return fmt.Errorf("%w: holder name of %d bytes", ErrBadDescriptor, len(d.Holder))
	}
	if len(d.Relay) > maxNameLen {
		return fmt.Errorf("%w: relay name of %d bytes", ErrBadDescriptor, len(d.Relay))
	}
	n, err := d.Shape.ByteSize(d.DType)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	if n != d.Bytes {
		return fmt.Errorf("%w: %w: %d bytes for %v of %v (want %d)", ErrBadDescriptor, ErrBadSize, d.Bytes, d.Shape, d.DType, n)
	}
	if _, err := memory.ParseDevice(d.Device); err != nil {
		return fmt.Errorf("%w: %w", ErrBadDescriptor, err)
	}
	if len(d.Offers) > maxOffers {
		return fmt.Errorf("%w: %d offers", ErrBadDescriptor, len(d.Offers))
	}
	for k, v := range d.Offers {
		if len(k) > maxNameLen || len(v) > maxOfferBytes {
			return fmt.Errorf("%w: offer %q of %d bytes", ErrBadDescriptor, k, len(v))
		}
	}
	return nil
}

// maxFields bounds the number of map entries a descriptor may have on the
// wire (10 known fields, room for later ones).
const maxFields = 32

var (
	_ msgpack.CustomDecoder = (*Descriptor)(nil)
	_ msgp.Marshaler        = (*Descriptor)(nil)
	_ msgp.Unmarshaler      = (*Descriptor)(nil)
	_ msgp.Sizer            = (*Descriptor)(nil)
)

// Msgsize implements msgp.Sizer: at least the bytes MarshalMsg appends.
func (d *Descriptor) Msgsize() int {
	n := 84 + len(d.Owner) + len(d.Device) + len(d.Holder) + len(d.Relay) + d.Shape.Msgsize()
	for k, v := range d.Offers {
		n += 2*msgp.BytesPrefixSize + len(k) + len(v)
	}
	return n
}

// MarshalMsg implements msgp.Marshaler: it appends the encoding msgpack's
// reflection writes for the struct tags (wire's encoder: compact integers,
// sorted map keys), written with msgp's primitives.
func (d *Descriptor) MarshalMsg(b []byte) ([]byte, error) {
	n := uint32(8)
	if d.Holder != "" {
		n++
	}
	if len(d.Offers) != 0 {
		n++
	}
	if d.Content != 0 {
		n++
	}
	if d.Relay != "" {
		n++
	}
	b = msgp.AppendMapHeader(b, n)
	b = msgp.AppendString(msgp.AppendString(b, "o"), d.Owner)
	b = msgp.AppendUint64(msgp.AppendString(b, "i"), d.Incarnation)
	b = msgp.AppendUint64(msgp.AppendString(b, "e"), d.ExportID)
	b = msgp.AppendUint64(msgp.AppendString(b, "l"), d.Lease)
	b = msgp.AppendUint8(msgp.AppendString(b, "t"), uint8(d.DType))
	b, _ = d.Shape.MarshalMsg(msgp.AppendString(b, "s"))
	b = appendInt(msgp.AppendString(b, "b"), d.Bytes)
	b = msgp.AppendString(msgp.AppendString(b, "d"), d.Device)
	if d.Holder != "" {
		b = msgp.AppendString(msgp.AppendString(b, "h"), d.Holder)
	}
	if len(d.Offers) != 0 {
		b = msgp.AppendMapHeader(msgp.AppendString(b, "f"), uint32(len(d.Offers)))
		keys := make([]string, 0, len(d.Offers))
		for k := range d.Offers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendBytesOrNil(msgp.AppendString(b, k), d.Offers[k])
		}
	}
	if d.Content != 0 {
		b = msgp.AppendUint64(msgp.AppendString(b, "c"), d.Content)
	}
	if d.Relay != "" {
		b = msgp.AppendString(msgp.AppendString(b, "r"), d.Relay)
	}
	return b, nil
}

// AppendInt appends v as msgpack's reflection does with compact integers:
// a non-negative value in the smallest unsigned form, a negative one in the
// smallest signed form.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(b, uint64(v))
	}
	return msgp.AppendInt64(b, v)
}

// AppendBytesOrNil appends p as a bin, or nil for a nil p, as msgpack's
// reflection does.
func appendBytesOrNil(b, p []byte) []byte {
	if p == nil {
		return msgp.AppendNil(b)
	}
	return msgp.AppendBytes(b, p)
}

// UnmarshalMsg implements msgp.Unmarshaler: it decodes the descriptor at
// the start of b and returns the bytes that follow. It applies the limits
// of Validate while decoding, so that no count read from the input sizes an
// allocation beyond them. Unknown fields are skipped (their nesting must
// have been bounded by the caller, as wire's decoders do).
func (d *Descriptor) UnmarshalMsg(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, err
	}
	if n > maxFields {
		return nil, fmt.Errorf("%w: %d fields", ErrBadDescriptor, n)
	}
	var out Descriptor
	for range n {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return nil, fmt.Errorf("%w: field name: %w", ErrBadDescriptor, err)
		}
		switch string(key) {
		case "o":
			out.Owner, b, err = msgp.ReadStringBytes(b)
		case "i":
			out.Incarnation, b, err = msgp.ReadUint64Bytes(b)
		case "e":
			out.ExportID, b, err = msgp.ReadUint64Bytes(b)
		case "l":
			out.Lease, b, err = msgp.ReadUint64Bytes(b)
		case "t":
			var v uint8
			v, b, err = msgp.ReadUint8Bytes(b)
			out.DType = DType(v)
		case "s":
			b, err = out.Shape.UnmarshalMsg(b)
		case "b":
			out.Bytes, b, err = msgp.ReadInt64Bytes(b)
		case "d":
			out.Device, b, err = msgp.ReadStringBytes(b)
		case "f":
			out.Offers, b, err = readOffers(b)
		case "h":
			out.Holder, b, err = msgp.ReadStringBytes(b)
		case "c":
			out.Content, b, err = msgp.ReadUint64Bytes(b)
		case "r":
			out.Relay, b, err = msgp.ReadStringBytes(b)
		default:
			b, err = msgp.Skip(b)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: field %q: %w", ErrBadDescriptor, key, err)
		}
	}
	*d = out
	return b, nil
}

// DecodeMsgpack implements msgpack.CustomDecoder with UnmarshalMsg, for
// descriptors inside values msgpack's reflection decodes. Encoding is
// msgpack's default for the struct tags, the bytes MarshalMsg writes.
func (d *Descriptor) DecodeMsgpack(dec *msgpack.Decoder) error {
	raw, err := dec.DecodeRaw()
	if err != nil {
		return err
	}
	rest, err := d.UnmarshalMsg(raw)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %d bytes after the descriptor", ErrBadDescriptor, len(rest))
	}
	return err
}

func readOffers(b []byte) (map[string][]byte, []byte, error) {
	if msgp.IsNil(b) {
		return nil, b[1:], nil
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, nil, err
	}
	if n > maxOffers {
		return nil, nil, fmt.Errorf("%d offers > %d", n, maxOffers)
	}
	m := make(map[string][]byte, n)
	for range n {
		var k string
		var v []byte
		if k, b, err = msgp.ReadStringBytes(b); err != nil {
			return nil, nil, err
		}
		if msgp.IsNil(b) {
			b = b[1:]
		} else if v, b, err = msgp.ReadBytesBytes(b, nil); err != nil {
			return nil, nil, err
		}
		if len(k) > maxNameLen || len(v) > maxOfferBytes {
			return nil, nil, fmt.Errorf("offer %q of %d bytes", k, len(v))
		}
		m[k] = v
	}
	return m, b, nil
}

// String describes the descriptor without its offers.
func (d *Descriptor) String() string {
	return fmt.Sprintf("%s#%d/%d export %d: %v%v (%d bytes) on %s", d.Owner, d.Incarnation, d.Lease, d.ExportID, d.DType, d.Shape, d.Bytes, d.Device)
}
