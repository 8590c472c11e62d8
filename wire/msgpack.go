package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxMsgpackDepth is the deepest nesting of msgpack arrays and maps that
// DecodeMsgpack and the frame decoders accept.
const MaxMsgpackDepth = 32

var (
	errMsgpackTruncated = errors.New("wire: msgpack: truncated value")
	errMsgpackLength    = errors.New("wire: msgpack: declared length exceeds input")
	errMsgpackDepth     = errors.New("wire: msgpack: nesting too deep")
	errMsgpackTrailing  = errors.New("wire: msgpack: trailing bytes after value")
	errMsgpackCode      = errors.New("wire: msgpack: invalid type code 0xc1")
)

// checkMsgpack walks one msgpack value in b without allocating and rejects:
// any str/bin/ext length larger than the bytes that remain, any array count
// larger than the bytes that remain (each element takes at least one byte),
// any map count with more than half the remaining bytes, nesting deeper than
// maxDepth, the never-used code 0xc1 and bytes after the value. msgpack v5
// preallocates from declared lengths, so every body is checked before it is
// decoded.
func checkMsgpack(b []byte, maxDepth int) error {
	// pending[i] is the number of values still expected at nesting level i.
	var stack [MaxMsgpackDepth + 1]uint64
	if maxDepth > MaxMsgpackDepth {
		maxDepth = MaxMsgpackDepth
	}
	depth := 0
	stack[0] = 1
	pos := 0
	for {
		for stack[depth] == 0 {
			if depth == 0 {
				if pos != len(b) {
					return fmt.Errorf("%w (%d of %d bytes used)", errMsgpackTrailing, pos, len(b))
				}
				return nil
			}
			depth--
		}
		stack[depth]--
		if pos >= len(b) {
			return errMsgpackTruncated
		}
		c := b[pos]
		pos++
		var skip uint64     // payload bytes to skip
		var children uint64 // nested values that follow
		var isMap bool
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
			// fixint, nil, bool
		case c >= 0x80 && c <= 0x8f:
			children, isMap = uint64(c&0x0f), true
		case c >= 0x90 && c <= 0x9f:
			children = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc1:
			return errMsgpackCode
		case c == 0xc4, c == 0xd9: // bin8, str8
			n, err := readLen(b, &pos, 1)
			if err != nil {
				return err
			}
			skip = n
		case c == 0xc5, c == 0xda: // bin16, str16
			n, err := readLen(b, &pos, 2)
			if err != nil {
				return err
			}
			skip = n
		case c == 0xc6, c == 0xdb: // bin32, str32
			n, err := readLen(b, &pos, 4)
			if err != nil {
				return err
			}
			skip = n
		case c == 0xc7, c == 0xc8, c == 0xc9: // ext8/16/32: len, type, data
			n, err := readLen(b, &pos, 1<<(c-0xc7))
			if err != nil {
				return err
			}
			skip = n + 1
		case c == 0xca, c == 0xce, c == 0xd2: // float32, uint32, int32
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3: // float64, uint64, int64
			skip = 8
		case c == 0xcc, c == 0xd0: // uint8, int8
			skip = 1
		case c == 0xcd, c == 0xd1: // uint16, int16
			skip = 2
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc: // array16
			n, err := readLen(b, &pos, 2)
			if err != nil {
				return err
			}
			children = n
		case c == 0xdd: // array32
			n, err := readLen(b, &pos, 4)
			if err != nil {
				return err
			}
			children = n
		case c == 0xde: // map16
			n, err := readLen(b, &pos, 2)
			if err != nil {
				return err
			}
			children, isMap = n, true
		case c == 0xdf: // map32
			n, err := readLen(b, &pos, 4)
			if err != nil {
				return err
			}
			children, isMap = n, true
		}
		rest := uint64(len(b) - pos)
		if skip > rest {
			return fmt.Errorf("%w (%d > %d)", errMsgpackLength, skip, rest)
		}
		pos += int(skip)
		if children == 0 {
			continue
		}
		if isMap {
			children *= 2
		}
		if children > rest {
			return fmt.Errorf("%w (%d values in %d bytes)", errMsgpackLength, children, rest)
		}
		if depth+1 > maxDepth {
			return errMsgpackDepth
		}
		depth++
		stack[depth] = children
	}
}

// readLen reads an n-byte big-endian length at *pos.
func readLen(b []byte, pos *int, n int) (uint64, error) {
	if len(b)-*pos < n {
		return 0, errMsgpackTruncated
	}
	p := b[*pos : *pos+n]
	*pos += n
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	default:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
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

// EncodeMsgpack returns the msgpack encoding of v, in the deterministic form
// used by frame bodies.
func EncodeMsgpack(v any) ([]byte, error) {
	return appendMsgpack(nil, v)
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

// DecodeMsgpack decodes the single msgpack value b into v (a pointer). The
// input is validated first (see ErrBadBody): declared lengths must fit in b,
// nesting is at most MaxMsgpackDepth and no bytes may follow the value. v
// does not alias b.
func DecodeMsgpack(b []byte, v any) error {
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
