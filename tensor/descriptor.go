package tensor

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
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
// wire (9 known fields, room for later ones).
const maxFields = 32

var _ msgpack.CustomDecoder = (*Descriptor)(nil)

// DecodeMsgpack implements msgpack.CustomDecoder. It applies the limits of
// Validate while decoding, so that no count read from the input
// preallocates beyond them (msgpack's own decoder would make a map of up to
// a million entries from a 5-byte header). Unknown fields are skipped.
// Encoding is msgpack's default for the struct tags.
func (d *Descriptor) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	if n > maxFields {
		return fmt.Errorf("%w: %d fields", ErrBadDescriptor, n)
	}
	var out Descriptor
	for range max(n, 0) {
		key, err := dec.DecodeString()
		if err != nil {
			return err
		}
		switch key {
		case "o":
			out.Owner, err = dec.DecodeString()
		case "i":
			out.Incarnation, err = dec.DecodeUint64()
		case "e":
			out.ExportID, err = dec.DecodeUint64()
		case "l":
			out.Lease, err = dec.DecodeUint64()
		case "t":
			var v uint8
			v, err = dec.DecodeUint8()
			out.DType = DType(v)
		case "s":
			err = out.Shape.DecodeMsgpack(dec)
		case "b":
			out.Bytes, err = dec.DecodeInt64()
		case "d":
			out.Device, err = dec.DecodeString()
		case "f":
			out.Offers, err = decodeOffers(dec)
		case "h":
			out.Holder, err = dec.DecodeString()
		default:
			err = dec.Skip()
		}
		if err != nil {
			return fmt.Errorf("%w: field %q: %w", ErrBadDescriptor, key, err)
		}
	}
	*d = out
	return nil
}

func decodeOffers(dec *msgpack.Decoder) (map[string][]byte, error) {
	n, err := dec.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, err
	}
	if n > maxOffers {
		return nil, fmt.Errorf("%d offers > %d", n, maxOffers)
	}
	m := make(map[string][]byte, n)
	for range n {
		k, err := dec.DecodeString()
		if err != nil {
			return nil, err
		}
		v, err := dec.DecodeBytes()
		if err != nil {
			return nil, err
		}
		if len(k) > maxNameLen || len(v) > maxOfferBytes {
			return nil, fmt.Errorf("offer %q of %d bytes", k, len(v))
		}
		m[k] = v
	}
	return m, nil
}

// String describes the descriptor without its offers.
func (d *Descriptor) String() string {
	return fmt.Sprintf("%s#%d/%d export %d: %v%v (%d bytes) on %s", d.Owner, d.Incarnation, d.Lease, d.ExportID, d.DType, d.Shape, d.Bytes, d.Device)
}
