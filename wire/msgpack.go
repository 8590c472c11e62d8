package wire

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// MaxMsgpackDepth is the deepest nesting of msgpack arrays and maps that
// DecodeMsgpack and the frame decoders accept.
const MaxMsgpackDepth = 32

var (
	errMsgpackLength   = errors.New("wire: msgpack: declared length exceeds input")
	errMsgpackDepth    = errors.New("wire: msgpack: nesting too deep")
	errMsgpackTrailing = errors.New("wire: msgpack: trailing bytes after value")
)

// checkMsgpack checks that b is exactly one msgpack value, using msgp's
// readers: every str/bin/ext length fits in the bytes that remain (msgp.Skip
// checks it), every array count is at most the bytes that remain (each
// element takes at least one byte) and every map count at most half of
// them, nesting is at most maxDepth (at most MaxMsgpackDepth), the
// never-used code 0xc1 does not appear and no bytes follow the value. It
// allocates nothing. Decoders that size allocations from declared counts
// (vmihailenco's, msgp's generated ones) only see bodies it accepted, so a
// count never promises more than the bytes that are there.
func checkMsgpack(b []byte, maxDepth int) error {
	rest, err := checkValue(b, min(maxDepth, MaxMsgpackDepth))
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w (%d of %d bytes used)", errMsgpackTrailing, len(b)-len(rest), len(b))
	}
	return nil
}

// CheckMsgpack reports whether b is exactly one msgpack value within the
// limits every decoder of this package applies before decoding (ErrBadBody
// wrapped otherwise): declared lengths and counts fit in the bytes that are
// there and nesting is at most MaxMsgpackDepth. Decoders outside wire that
// read bytes from the wire with msgp's readers call it first.
func CheckMsgpack(b []byte) error {
	if err := checkMsgpack(b, MaxMsgpackDepth); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	return nil
}

// checkValue checks the value at the start of b (see checkMsgpack) with
// depth more levels of arrays and maps allowed, and returns what follows
// it.
func checkValue(b []byte, depth int) ([]byte, error) { return checkValueBy(b, depth, true) }

// checkValueBy is checkValue, reading the common one-byte codes itself
// when fast is set, else everything through msgp's general readers (for
// FuzzCheckMsgpack, which compares the two).
func checkValueBy(b []byte, depth int, fast bool) ([]byte, error) {
	if fast && len(b) > 0 {
		switch c := b[0]; {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixints, nil, bools
			return b[1:], nil
		case c&0xe0 == 0xa0: // fixstr
			if n := int(c & 0x1f); n < len(b) {
				return b[1+n:], nil
			}
		case c == 0xc4 || c == 0xd9: // bin8, str8
			if len(b) >= 2 && int(b[1]) <= len(b)-2 {
				return b[2+int(b[1]):], nil
			}
		case c&0xf0 == 0x80: // fixmap
			return checkItems(b[1:], 2*uint64(c&0x0f), depth, fast)
		case c&0xf0 == 0x90: // fixarray
			return checkItems(b[1:], uint64(c&0x0f), depth, fast)
		}
	}
	var n uint64
	var rest []byte
	switch msgp.NextType(b) {
	case msgp.MapType:
		sz, r, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			return nil, err
		}
		n, rest = 2*uint64(sz), r
	case msgp.ArrayType:
		sz, r, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			return nil, err
		}
		n, rest = uint64(sz), r
	default:
		// A scalar, str, bin or ext: Skip checks its length against b
		// (and fails on an empty b or the code 0xc1).
		return msgp.Skip(b)
	}
	return checkItems(rest, n, depth, fast)
}

// checkItems checks the n values of an array or map (keys and values) at
// the start of rest, one level deeper than depth allows, and returns what
// follows them.
func checkItems(rest []byte, n uint64, depth int, fast bool) ([]byte, error) {
	if n == 0 {
		return rest, nil
	}
	if n > uint64(len(rest)) {
		return nil, fmt.Errorf("%w (%d values in %d bytes)", errMsgpackLength, n, len(rest))
	}
	if depth == 0 {
		return nil, errMsgpackDepth
	}
	for ; n > 0; n-- {
		var err error
		if rest, err = checkValueBy(rest, depth-1, fast); err != nil {
			return nil, err
		}
	}
	return rest, nil
}

// sliceWriter appends to a byte slice; the msgpack encoder writes through it
// straight into the frame buffer.
type sliceWriter struct{ b []byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *sliceWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

// msgpackEncoder is a pooled encoder writing through a sliceWriter.
type msgpackEncoder struct {
	w   sliceWriter
	enc *msgpack.Encoder
}

var encoderPool = sync.Pool{New: func() any {
	e := &msgpackEncoder{}
	e.enc = msgpack.NewEncoder(&e.w)
	e.enc.UseCompactInts(true)
	e.enc.SetSortMapKeys(true)
	return e
}}

// appendMsgpack appends the msgpack encoding of v to dst. Integers are
// encoded in their smallest form and map keys are sorted, so the encoding
// is deterministic.
func appendMsgpack(dst []byte, v any) ([]byte, error) {
	e := encoderPool.Get().(*msgpackEncoder)
	if dst == nil {
		// Most bodies are small: one allocation instead of several
		// doublings.
		dst = make([]byte, 0, 128)
	}
	e.w.b = dst
	err := e.enc.Encode(v)
	out := e.w.b
	e.w.b = nil
	encoderPool.Put(e)
	if err != nil {
		return dst, fmt.Errorf("wire: msgpack encode %T: %w", v, err)
	}
	return out, nil
}

// appendBody appends the msgpack encoding of v: through its generated
// MarshalMsg if it has one (a *Message, a type msgp's generator wrote
// methods for), else through vmihailenco (appendMsgpack).
func appendBody(dst []byte, v any) ([]byte, error) {
	if m, ok := v.(msgp.Marshaler); ok {
		return appendGenerated(dst, m)
	}
	return appendMsgpack(dst, v)
}

// EncodeMsgpack returns the msgpack encoding of v, in the deterministic form
// used by frame bodies: v's own MarshalMsg if it implements msgp.Marshaler,
// else vmihailenco/msgpack's encoding with compact integers and sorted map
// keys.
func EncodeMsgpack(v any) ([]byte, error) {
	return appendBody(nil, v)
}

type msgpackDecoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

var decoderPool = sync.Pool{New: func() any {
	d := &msgpackDecoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}}

// DecodeMsgpack decodes the single msgpack value b into v (a pointer), with
// v's UnmarshalMsg if it implements msgp.Unmarshaler, else with
// vmihailenco/msgpack. The input is validated first (see ErrBadBody):
// declared lengths and counts must fit in b, nesting is at most
// MaxMsgpackDepth and no bytes may follow the value. v does not alias b
// (for generated decoders: as far as their UnmarshalMsg copies, which
// msgp's generated code does).
func DecodeMsgpack(b []byte, v any) error {
	if u, ok := v.(msgp.Unmarshaler); ok {
		return decodeGenerated(b, u)
	}
	if err := checkMsgpack(b, MaxMsgpackDepth); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	return decodeMsgpackChecked(b, v)
}

// decodeMsgpackChecked is DecodeMsgpack for b that checkMsgpack has
// accepted.
func decodeMsgpackChecked(b []byte, v any) error {
	d := decoderPool.Get().(*msgpackDecoder)
	defer decoderPool.Put(d)
	d.r.Reset(b)
	d.dec.ResetReader(&d.r)
	if err := d.dec.Decode(v); err != nil {
		return fmt.Errorf("%w: decode %T: %w", ErrBadBody, v, err)
	}
	return nil
}
