package tensor

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// In a message body, a *Tensor or Ref field is encoded as a reference to an
// entry of the message's tensor table, which travels beside the body: the
// msgpack array [kind, id], where id is the tensor's (or Ref's) WireID.
// The body never holds tensor bytes nor descriptors; the transfer engine
// builds the table on the sending node (inline bytes, or the descriptor of
// an export) and fills the fields back from it on the receiving node.
//
// Decoding a body yields placeholders: tensors and Refs that name a table
// entry and hold nothing else until the engine fills them (Fill, FillRef).
// A placeholder that was never filled has no buffer; outside a node, a
// message with tensor fields cannot be decoded into usable tensors.
const (
	fieldTensor = 1 // [1, id]: a *Tensor, filled before delivery
	fieldRef    = 3 // [3, id]: a Ref, fetched when its receiver asks
)

// ErrNotPlaceholder is returned by Fill and FillRef for a tensor or Ref that
// was not decoded from a message body, or was filled already.
var ErrNotPlaceholder = errors.New("tensor: not an unfilled placeholder")

// nextWireID numbers tensors and Refs within the process.
var nextWireID atomic.Uint64

func newWireID() uint64 { return nextWireID.Add(1) }

// Both msgpack codecs a message type may use write and read the same
// field encoding: vmihailenco/msgpack's reflection (EncodeMsgpack,
// DecodeMsgpack) and the code tinylib/msgp's generator writes for message
// types (MarshalMsg, UnmarshalMsg, Msgsize).
var (
	_ msgpack.CustomEncoder = (*Tensor)(nil)
	_ msgpack.CustomDecoder = (*Tensor)(nil)
	_ msgpack.CustomEncoder = Ref{}
	_ msgpack.CustomDecoder = (*Ref)(nil)
	_ msgp.Marshaler        = (*Tensor)(nil)
	_ msgp.Unmarshaler      = (*Tensor)(nil)
	_ msgp.Sizer            = (*Tensor)(nil)
	_ msgp.Marshaler        = Ref{}
	_ msgp.Unmarshaler      = (*Ref)(nil)
	_ msgp.Sizer            = Ref{}
)

// WireID identifies the tensor within this process: a message body refers
// to the tensor's entry in the message's tensor table by it.
func (t *Tensor) WireID() uint64 { return t.id }

// Placeholder reports whether t was decoded from a message body and not
// filled yet, and the id of its entry in the message's tensor table.
func Placeholder(t *Tensor) (id uint64, ok bool) {
	if t == nil || !t.placeholder {
		return 0, false
	}
	return t.id, true
}

// Fill makes the placeholder t hold src: t takes src's dtype, shape and
// buffer (src must not be used afterwards) and a new WireID.
func Fill(t, src *Tensor) error {
	if _, ok := Placeholder(t); !ok {
		return ErrNotPlaceholder
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dtype, t.shape, t.buf = src.dtype, src.shape, src.buf
	t.id, t.placeholder = newWireID(), false
	t.idle = closedIdle
	return nil
}

// EncodeMsgpack implements msgpack.CustomEncoder: the reference [1, WireID].
func (t *Tensor) EncodeMsgpack(enc *msgpack.Encoder) error {
	return encodeField(enc, fieldTensor, t.id)
}

// DecodeMsgpack implements msgpack.CustomDecoder: t becomes a placeholder.
func (t *Tensor) DecodeMsgpack(dec *msgpack.Decoder) error {
	id, err := decodeField(dec, fieldTensor)
	if err != nil {
		return err
	}
	t.id, t.placeholder = id, true
	return nil
}

// MarshalMsg implements msgp.Marshaler, for message types whose codecs
// msgp generated: it appends the reference [1, WireID], as EncodeMsgpack
// writes it.
func (t *Tensor) MarshalMsg(b []byte) ([]byte, error) {
	return appendField(b, fieldTensor, t.id), nil
}

// UnmarshalMsg implements msgp.Unmarshaler: t becomes a placeholder, as
// with DecodeMsgpack. It returns the bytes that follow the field.
func (t *Tensor) UnmarshalMsg(b []byte) ([]byte, error) {
	id, rest, err := readField(b, fieldTensor)
	if err != nil {
		return b, err
	}
	t.id, t.placeholder = id, true
	return rest, nil
}

// Msgsize implements msgp.Sizer: the most bytes MarshalMsg appends.
func (t *Tensor) Msgsize() int { return fieldSize }

// WireID identifies the Ref within this process (0 for the empty Ref).
func (r Ref) WireID() uint64 {
	if r.st == nil {
		return 0
	}
	return r.st.id
}

// RefPlaceholder reports whether r was decoded from a message body and not
// filled yet, and the id of its entry in the message's tensor table.
func RefPlaceholder(r Ref) (id uint64, ok bool) {
	if r.st == nil {
		return 0, false
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if !r.st.placeholder {
		return 0, false
	}
	return r.st.id, true
}

// FillRef makes the placeholder r a Ref that fetches d through f.
func FillRef(r Ref, d *Descriptor, f Fetcher) error {
	if r.st == nil {
		return ErrNotPlaceholder
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if !r.st.placeholder {
		return ErrNotPlaceholder
	}
	r.st.desc, r.st.fetcher, r.st.placeholder = d, f, false
	r.st.id = newWireID()
	return nil
}

// EncodeMsgpack implements msgpack.CustomEncoder: nil for the empty Ref,
// else the reference [3, WireID].
func (r Ref) EncodeMsgpack(enc *msgpack.Encoder) error {
	if r.st == nil {
		return enc.EncodeNil()
	}
	return encodeField(enc, fieldRef, r.st.id)
}

// DecodeMsgpack implements msgpack.CustomDecoder: r becomes a placeholder
// (or the empty Ref for nil).
func (r *Ref) DecodeMsgpack(dec *msgpack.Decoder) error {
	code, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if code == 0xc0 { // nil
		*r = Ref{}
		return dec.DecodeNil()
	}
	id, err := decodeField(dec, fieldRef)
	if err != nil {
		return err
	}
	*r = Ref{st: &refState{id: id, placeholder: true}}
	return nil
}

// MarshalMsg implements msgp.Marshaler: nil for the empty Ref, else the
// reference [3, WireID], as EncodeMsgpack writes them.
func (r Ref) MarshalMsg(b []byte) ([]byte, error) {
	if r.st == nil {
		return msgp.AppendNil(b), nil
	}
	return appendField(b, fieldRef, r.st.id), nil
}

// UnmarshalMsg implements msgp.Unmarshaler: r becomes a placeholder (or
// the empty Ref for nil), as with DecodeMsgpack.
func (r *Ref) UnmarshalMsg(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		*r = Ref{}
		return b[1:], nil
	}
	id, rest, err := readField(b, fieldRef)
	if err != nil {
		return b, err
	}
	*r = Ref{st: &refState{id: id, placeholder: true}}
	return rest, nil
}

// Msgsize implements msgp.Sizer: the most bytes MarshalMsg appends.
func (r Ref) Msgsize() int { return fieldSize }

// fieldSize is the largest encoding of a field: a fixarray header, a
// fixint kind and a uint64.
const fieldSize = 2 + msgp.Uint64Size

func appendField(b []byte, kind uint8, id uint64) []byte {
	return msgp.AppendUint64(msgp.AppendUint8(msgp.AppendArrayHeader(b, 2), kind), id)
}

func readField(b []byte, want uint8) (uint64, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, nil, err
	}
	if n != 2 {
		return 0, nil, fmt.Errorf("tensor: bad field encoding (%d elements, want 2)", n)
	}
	kind, b, err := msgp.ReadUint8Bytes(b)
	if err != nil {
		return 0, nil, err
	}
	if kind != want {
		return 0, nil, fmt.Errorf("tensor: bad field encoding (kind %d, want %d)", kind, want)
	}
	return msgp.ReadUint64Bytes(b)
}

func encodeField(enc *msgpack.Encoder, kind uint8, id uint64) error {
	if err := enc.EncodeArrayLen(2); err != nil {
		return err
	}
	// EncodeUint writes the smallest form, as msgp's appendField does.
	if err := enc.EncodeUint(uint64(kind)); err != nil {
		return err
	}
	return enc.EncodeUint(id)
}

func decodeField(dec *msgpack.Decoder, want uint8) (uint64, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n != 2 {
		return 0, fmt.Errorf("tensor: bad field encoding (%d elements, want 2)", n)
	}
	kind, err := dec.DecodeUint8()
	if err != nil {
		return 0, err
	}
	if kind != want {
		return 0, fmt.Errorf("tensor: bad field encoding (kind %d, want %d)", kind, want)
	}
	return dec.DecodeUint64()
}
