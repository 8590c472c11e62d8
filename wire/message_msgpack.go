package wire

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// Message is the hot path of the control plane, so it encodes and decodes
// itself instead of going through msgpack's reflection. The bytes are the
// same as the struct tags describe: a map with short keys in field order,
// zero fields omitted, compact integers, header keys sorted.

var (
	_ msgpack.CustomEncoder = (*Message)(nil)
	_ msgpack.CustomDecoder = (*Message)(nil)
)

// EncodeMsgpack implements msgpack.CustomEncoder.
func (m *Message) EncodeMsgpack(e *msgpack.Encoder) error {
	n := 0
	for _, set := range [...]bool{m.Target != "", m.SenderNode != "", m.SenderID != "", m.Type != "",
		m.Ser != 0, len(m.Body) != 0, len(m.Header) != 0, m.Request != 0, len(m.Tensors) != 0} {
		if set {
			n++
		}
	}
	if err := e.EncodeMapLen(n); err != nil {
		return err
	}
	str := func(key, v string) error {
		if v == "" {
			return nil
		}
		if err := e.EncodeString(key); err != nil {
			return err
		}
		return e.EncodeString(v)
	}
	if err := str("t", m.Target); err != nil {
		return err
	}
	if err := str("sn", m.SenderNode); err != nil {
		return err
	}
	if err := str("si", m.SenderID); err != nil {
		return err
	}
	if err := str("ty", m.Type); err != nil {
		return err
	}
	if m.Ser != 0 {
		if err := e.EncodeString("s"); err != nil {
			return err
		}
		if err := e.EncodeUint(uint64(m.Ser)); err != nil {
			return err
		}
	}
	if len(m.Body) != 0 {
		if err := e.EncodeString("b"); err != nil {
			return err
		}
		if err := e.EncodeBytes(m.Body); err != nil {
			return err
		}
	}
	if len(m.Header) != 0 {
		if err := e.EncodeString("h"); err != nil {
			return err
		}
		if err := e.EncodeMapLen(len(m.Header)); err != nil {
			return err
		}
		var small [8]string
		keys := small[:0]
		for k := range m.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := e.EncodeString(k); err != nil {
				return err
			}
			if err := e.EncodeString(m.Header[k]); err != nil {
				return err
			}
		}
	}
	if m.Request != 0 {
		if err := e.EncodeString("r"); err != nil {
			return err
		}
		if err := e.EncodeUint(m.Request); err != nil {
			return err
		}
	}
	if len(m.Tensors) != 0 {
		if err := e.EncodeString("x"); err != nil {
			return err
		}
		if err := e.EncodeBytes(m.Tensors); err != nil {
			return err
		}
	}
	return nil
}

// DecodeMsgpack implements msgpack.CustomDecoder. Unknown keys are
// skipped. It shares decodeMessage with the frame parser, so both accept
// exactly the same input.
func (m *Message) DecodeMsgpack(d *msgpack.Decoder) error {
	raw, err := d.DecodeRaw()
	if err != nil {
		return err
	}
	return decodeMessage(raw, m)
}

// mpReader reads msgpack that checkMsgpack has already accepted, without
// the allocations of msgpack.Decoder (keys are compared as bytes). It still
// checks every bound, so misuse gives an error, not a panic.
type mpReader struct {
	b   []byte
	pos int
}

var errMPType = fmt.Errorf("%w: unexpected msgpack type", ErrBadBody)

func (r *mpReader) code() (byte, error) {
	if r.pos >= len(r.b) {
		return 0, errMsgpackTruncated
	}
	c := r.b[r.pos]
	r.pos++
	return c, nil
}

func (r *mpReader) n(size int) (uint64, error) {
	return readLen(r.b, &r.pos, size)
}

func (r *mpReader) take(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.pos) {
		return nil, errMsgpackLength
	}
	p := r.b[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return p, nil
}

// mapLen returns the number of pairs of a map, or -1 for nil.
func (r *mpReader) mapLen() (int, error) {
	c, err := r.code()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c == 0xc0:
		return -1, nil
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == 0xde:
		n, err = r.n(2)
	case c == 0xdf:
		n, err = r.n(4)
	default:
		return 0, errMPType
	}
	if err == nil && n > uint64(len(r.b)-r.pos) {
		err = errMsgpackLength
	}
	return int(n), err
}

// raw returns the bytes of a str or bin value without copying (nil for a
// msgpack nil).
func (r *mpReader) raw() ([]byte, error) {
	c, err := r.code()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c == 0xc0:
		return nil, nil
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xc4 || c == 0xd9:
		n, err = r.n(1)
	case c == 0xc5 || c == 0xda:
		n, err = r.n(2)
	case c == 0xc6 || c == 0xdb:
		n, err = r.n(4)
	default:
		return nil, errMPType
	}
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

func (r *mpReader) str() (string, error) {
	p, err := r.raw()
	return string(p), err
}

func (r *mpReader) cachedStr(c *stringCache) (string, error) {
	p, err := r.raw()
	if err != nil || p == nil {
		return "", err
	}
	return c.get(p), nil
}

// uint reads a non-negative integer of at most bits bits.
func (r *mpReader) uint(bits int) (uint64, error) {
	c, err := r.code()
	if err != nil {
		return 0, err
	}
	var v uint64
	var neg bool
	switch {
	case c <= 0x7f:
		v = uint64(c)
	case c == 0xc0:
		v = 0
	case c == 0xcc || c == 0xd0:
		v, err = r.n(1)
		neg = c == 0xd0 && v >= 1<<7
	case c == 0xcd || c == 0xd1:
		v, err = r.n(2)
		neg = c == 0xd1 && v >= 1<<15
	case c == 0xce || c == 0xd2:
		v, err = r.n(4)
		neg = c == 0xd2 && v >= 1<<31
	case c == 0xcf || c == 0xd3:
		var p []byte
		if p, err = r.take(8); err == nil {
			v = uint64(p[0])<<56 | uint64(p[1])<<48 | uint64(p[2])<<40 | uint64(p[3])<<32 |
				uint64(p[4])<<24 | uint64(p[5])<<16 | uint64(p[6])<<8 | uint64(p[7])
		}
		neg = c == 0xd3 && v >= 1<<63
	default:
		return 0, errMPType
	}
	if err != nil {
		return 0, err
	}
	if neg || bits < 64 && v >= 1<<bits {
		return 0, fmt.Errorf("%w: integer out of range for %d bits", ErrBadBody, bits)
	}
	return v, nil
}

// skip skips one value of any type.
func (r *mpReader) skip() error {
	end, err := msgpackValueEnd(r.b, r.pos)
	if err != nil {
		return err
	}
	r.pos = end
	return nil
}

// msgpackValueEnd returns the offset just past the value starting at pos.
func msgpackValueEnd(b []byte, pos int) (int, error) {
	for pending := uint64(1); pending > 0; pending-- {
		if pos >= len(b) {
			return 0, errMsgpackTruncated
		}
		c := b[pos]
		pos++
		var skip, children uint64
		var err error
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			children = 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			children = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4, c == 0xd9:
			skip, err = readLen(b, &pos, 1)
		case c == 0xc5, c == 0xda:
			skip, err = readLen(b, &pos, 2)
		case c == 0xc6, c == 0xdb:
			skip, err = readLen(b, &pos, 4)
		case c == 0xc7, c == 0xc8, c == 0xc9:
			skip, err = readLen(b, &pos, 1<<(c-0xc7))
			skip++
		case c == 0xca, c == 0xce, c == 0xd2:
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3:
			skip = 8
		case c == 0xcc, c == 0xd0:
			skip = 1
		case c == 0xcd, c == 0xd1:
			skip = 2
		case c >= 0xd4 && c <= 0xd8:
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			children, err = readLen(b, &pos, 2)
		case c == 0xdd:
			children, err = readLen(b, &pos, 4)
		case c == 0xde:
			children, err = readLen(b, &pos, 2)
			children *= 2
		case c == 0xdf:
			children, err = readLen(b, &pos, 4)
			children *= 2
		default:
			return 0, errMsgpackCode
		}
		if err != nil {
			return 0, err
		}
		if skip > uint64(len(b)-pos) || children > uint64(len(b)-pos) {
			return 0, errMsgpackLength
		}
		pos += int(skip)
		pending += children
	}
	return pos, nil
}

// decodeMessage decodes a Message body that checkMsgpack accepted; it gives
// the same result as msgpack.Decoder with Message.DecodeMsgpack.
func decodeMessage(b []byte, m *Message) error {
	return decodeMessageWith(b, m, nil, true)
}

// decodeMessageWith is decodeMessage with strings interned through strs
// (nil: none) and, unless copyBody, a Body that aliases b.
func decodeMessageWith(b []byte, m *Message, strs *stringCache, copyBody bool) error {
	*m = Message{}
	r := mpReader{b: b}
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range max(n, 0) {
		key, err := r.raw()
		if err != nil {
			return err
		}
		switch string(key) { // no allocation
		case "t":
			m.Target, err = r.cachedStr(strs)
		case "sn":
			m.SenderNode, err = r.cachedStr(strs)
		case "si":
			m.SenderID, err = r.str()
		case "ty":
			m.Type, err = r.cachedStr(strs)
		case "s":
			var v uint64
			v, err = r.uint(8)
			m.Ser = uint8(v)
		case "b":
			var p []byte
			if p, err = r.raw(); err == nil && p != nil {
				if copyBody {
					p = bytes.Clone(p)
				}
				m.Body = p
			}
		case "h":
			m.Header, err = r.stringMap()
		case "r":
			m.Request, err = r.uint(64)
		case "x":
			var p []byte
			if p, err = r.raw(); err == nil && p != nil {
				if copyBody {
					p = bytes.Clone(p)
				}
				m.Tensors = p
			}
		default:
			err = r.skip()
		}
		if err != nil {
			return fmt.Errorf("%w: message field %q: %w", ErrBadBody, key, err)
		}
	}
	if r.pos != len(b) {
		return errMsgpackTrailing
	}
	return nil
}

func (r *mpReader) stringMap() (map[string]string, error) {
	n, err := r.mapLen()
	if err != nil || n < 0 {
		return nil, err
	}
	// Not sized from n: a declared count is not bytes that are there
	// (a 16 MiB frame could declare millions of entries).
	h := make(map[string]string)
	for range n {
		k, err := r.str()
		if err != nil {
			return nil, err
		}
		v, err := r.str()
		if err != nil {
			return nil, err
		}
		h[k] = v
	}
	return h, nil
}
