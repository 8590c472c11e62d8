package wire

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// Message is the hot path of the control plane, so it encodes and decodes
// itself with msgp's primitives (the one msgpack layer of this package)
// instead of going through reflection. The bytes are those the struct tags
// describe, as vmihailenco/msgpack writes them: a map with short keys in
// field order, zero fields omitted, compact integers, header keys sorted.

var (
	_ msgp.Marshaler   = (*Message)(nil)
	_ msgp.Unmarshaler = (*Message)(nil)
)

// MarshalMsg implements msgp.Marshaler: it appends the encoding of m to b.
func (m *Message) MarshalMsg(b []byte) ([]byte, error) { return appendMessage(b, m), nil }

// UnmarshalMsg implements msgp.Unmarshaler: it decodes the Message at the
// start of b into m and returns the bytes that follow. Body, Tensors and
// Header do not alias b. Unknown keys are skipped.
func (m *Message) UnmarshalMsg(b []byte) ([]byte, error) {
	return readMessage(b, m, nil, true)
}

// appendMessage appends the msgpack encoding of m.
func appendMessage(dst []byte, m *Message) []byte {
	dst = msgp.AppendMapHeader(dst, messageFields(m))
	return appendMessageRest(appendMessageIDs(dst, m), m)
}

// messageFields returns the number of fields m's encoding has.
func messageFields(m *Message) uint32 {
	n := uint32(0)
	for _, set := range [...]bool{m.Target != "", m.SenderNode != "", m.SenderID != "", m.Type != "",
		m.Ser != 0, len(m.Body) != 0, len(m.Header) != 0, m.Request != 0, len(m.Tensors) != 0} {
		if set {
			n++
		}
	}
	return n
}

// appendMessageIDs appends the fields that name m's target, sender and
// type (the ones a stream of messages repeats), after the map header.
func appendMessageIDs(dst []byte, m *Message) []byte {
	if m.Target != "" {
		dst = appendStr(append(dst, 0xa1, 't'), m.Target)
	}
	if m.SenderNode != "" {
		dst = appendStr(append(dst, 0xa2, 's', 'n'), m.SenderNode)
	}
	if m.SenderID != "" {
		dst = appendStr(append(dst, 0xa2, 's', 'i'), m.SenderID)
	}
	if m.Type != "" {
		dst = appendStr(append(dst, 0xa2, 't', 'y'), m.Type)
	}
	if m.Ser != 0 {
		dst = msgp.AppendUint8(append(dst, 0xa1, 's'), m.Ser)
	}
	return dst
}

// appendMessageRest appends the fields of m after those of
// appendMessageIDs.
func appendMessageRest(dst []byte, m *Message) []byte {
	if len(m.Body) != 0 {
		dst = appendBin(append(dst, 0xa1, 'b'), m.Body)
	}
	if len(m.Header) != 0 {
		dst = appendHeader(append(dst, 0xa1, 'h'), m.Header)
	}
	if m.Request != 0 {
		dst = msgp.AppendUint64(append(dst, 0xa1, 'r'), m.Request)
	}
	if len(m.Tensors) != 0 {
		dst = appendBin(append(dst, 0xa1, 'x'), m.Tensors)
	}
	return dst
}

// appendStr appends s as a msgpack str, as msgp.AppendString does; a
// string of up to 31 bytes (a fixstr: every key and most names) without
// msgp's general path.
func appendStr(dst []byte, s string) []byte {
	if len(s) < 32 {
		return append(append(dst, 0xa0|byte(len(s))), s...)
	}
	return msgp.AppendString(dst, s)
}

// appendHeader appends h as a map with sorted keys. It is kept out of
// line: messages rarely carry headers, and its locals would otherwise
// enlarge the stack frame of every message send.
//
//go:noinline
func appendHeader(dst []byte, h map[string]string) []byte {
	dst = msgp.AppendMapHeader(dst, uint32(len(h)))
	var small [8]string
	keys := small[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst = appendStr(appendStr(dst, k), h[k])
	}
	return dst
}

// decodeMessage decodes b, exactly one Message, into m; Body and Tensors
// are copied.
func decodeMessage(b []byte, m *Message) error {
	rest, err := readMessage(b, m, nil, true)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%w: %w", ErrBadBody, errMsgpackTrailing)
	}
	return err
}

// readMessage decodes the Message at the start of b into m and returns the
// bytes that follow it. Strings are interned through strs (nil: none);
// unless copyBody, Body and Tensors alias b. Every read is bounded by the
// bytes that are there (msgp's readers check each declared length), and
// nothing is sized from a declared count. Errors wrap ErrBadBody.
func readMessage(b []byte, m *Message, strs *stringCache, copyBody bool) ([]byte, error) {
	*m = Message{}
	n, b, err := readMapHeader(b)
	if err != nil {
		return nil, fmt.Errorf("%w: message: %w", ErrBadBody, err)
	}
	for range n {
		var key uint32
		switch { // readKey, the keys this package writes inline
		case len(b) >= 2 && b[0] == 0xa1:
			key, b = 1<<16|uint32(b[1]), b[2:]
		case len(b) >= 3 && b[0] == 0xa2:
			key, b = 2<<16|uint32(b[1])<<8|uint32(b[2]), b[3:]
		default:
			if key, b, err = readKey(b); err != nil {
				return nil, fmt.Errorf("%w: message key: %w", ErrBadBody, err)
			}
		}
		switch key {
		case keyTarget:
			m.Target, b, err = readField(b, strs, fieldTarget)
		case keySenderNode:
			m.SenderNode, b, err = readField(b, strs, fieldSenderNode)
		case keySenderID:
			m.SenderID, b, err = readString(b)
		case keyType:
			m.Type, b, err = readField(b, strs, fieldType)
		case keySer:
			m.Ser, b, err = msgp.ReadUint8Bytes(b)
		case keyBody:
			m.Body, b, err = readBytes(b, copyBody)
		case keyHeader:
			m.Header, b, err = readStringMap(b)
		case keyRequest:
			m.Request, b, err = msgp.ReadUint64Bytes(b)
		case keyTensors:
			m.Tensors, b, err = readBytes(b, copyBody)
		default:
			b, err = checkValue(b, MaxMsgpackDepth)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: message field %q: %w", ErrBadBody, keyName(key), err)
		}
	}
	return b, nil
}

// The keys of a Message's fields as readKey returns them: the key's
// length, then its bytes.
const (
	keyTarget     = 1<<16 | 't'
	keySenderNode = 2<<16 | 's'<<8 | 'n'
	keySenderID   = 2<<16 | 's'<<8 | 'i'
	keyType       = 2<<16 | 't'<<8 | 'y'
	keySer        = 1<<16 | 's'
	keyBody       = 1<<16 | 'b'
	keyHeader     = 1<<16 | 'h'
	keyRequest    = 1<<16 | 'r'
	keyTensors    = 1<<16 | 'x'
)

// readKey reads a map key (a str or bin, as msgp.ReadMapKeyZC does) of one
// or two bytes as its length and bytes packed in a number (keyTarget…), so
// that a key is told by one comparison; any other key reads as 0 (skipped
// by readMessage). The fixstr keys this package writes are read without
// msgp's general path.
func readKey(b []byte) (uint32, []byte, error) {
	if len(b) >= 3 && b[0] == 0xa2 {
		return 2<<16 | uint32(b[1])<<8 | uint32(b[2]), b[3:], nil
	}
	if len(b) >= 2 && b[0] == 0xa1 {
		return 1<<16 | uint32(b[1]), b[2:], nil
	}
	key, rest, err := msgp.ReadMapKeyZC(b)
	if err != nil {
		return 0, nil, err
	}
	switch len(key) {
	case 1:
		return 1<<16 | uint32(key[0]), rest, nil
	case 2:
		return 2<<16 | uint32(key[0])<<8 | uint32(key[1]), rest, nil
	}
	return 0, rest, nil
}

// keyName is the key readKey read as key, for errors ("" for 0).
func keyName(key uint32) string {
	switch key >> 16 {
	case 1:
		return string([]byte{byte(key)})
	case 2:
		return string([]byte{byte(key >> 8), byte(key)})
	}
	return ""
}

// appendBin appends b as a msgpack bin, as msgp.AppendBytes does; one of
// up to 255 bytes (a bin8: most bodies) without msgp's general path.
func appendBin(dst, b []byte) []byte {
	if len(b) < 256 {
		return append(append(dst, 0xc4, byte(len(b))), b...)
	}
	return msgp.AppendBytes(dst, b)
}

// readMapHeader reads a map header (nil counts as an empty map) and checks
// that the bytes that follow can hold its entries.
func readMapHeader(b []byte) (uint32, []byte, error) {
	if len(b) > 0 && b[0]&0xf0 == 0x80 { // a fixmap: every Message
		if n := uint32(b[0] & 0x0f); 2*int(n) <= len(b)-1 {
			return n, b[1:], nil
		}
	}
	if msgp.IsNil(b) {
		return 0, b[1:], nil
	}
	n, rest, err := msgp.ReadMapHeaderBytes(b)
	if err == nil && 2*uint64(n) > uint64(len(rest)) {
		err = fmt.Errorf("%w (%d entries in %d bytes)", errMsgpackLength, n, len(rest))
	}
	return n, rest, err
}

// readString reads a str (nil reads as "").
func readString(b []byte) (string, []byte, error) {
	return readField(b, nil, 0)
}

// readField reads a str (nil reads as ""), the string of message field f
// (fieldTarget…), interned through strs (none when nil).
func readField(b []byte, strs *stringCache, f int) (string, []byte, error) {
	if len(b) > 0 && b[0]&0xe0 == 0xa0 { // a fixstr: most names
		if n := int(b[0] & 0x1f); n < len(b) {
			return strs.field(f, b[1:1+n]), b[1+n:], nil
		}
	}
	if msgp.IsNil(b) {
		return "", b[1:], nil
	}
	p, rest, err := msgp.ReadStringZC(b)
	if err != nil {
		return "", nil, err
	}
	return strs.field(f, p), rest, nil
}

// readBytes reads a bin (nil and empty read as nil), copied if copy is
// set, else aliasing b.
func readBytes(b []byte, copy bool) ([]byte, []byte, error) {
	var p, rest []byte
	var err error
	switch {
	case len(b) >= 2 && b[0] == 0xc4 && len(b)-2 >= int(b[1]): // a bin8: most bodies
		p, rest = b[2:2+int(b[1])], b[2+int(b[1]):]
	case msgp.IsNil(b):
		return nil, b[1:], nil
	default:
		p, rest, err = msgp.ReadBytesZC(b)
	}
	if err != nil || len(p) == 0 {
		return nil, rest, err
	}
	if copy {
		p = bytes.Clone(p)
	}
	return p, rest, nil
}

// Bounds of a message's header (protoactor's message headers: a few
// keys). A map of many small entries costs about 20 times its bytes in
// memory and seconds of CPU per 16 MiB frame, so both its entries and its
// bytes are bounded, before anything is stored.
const (
	// MaxHeaderEntries is the most entries a message header may have.
	MaxHeaderEntries = 64
	// MaxHeaderBytes bounds the keys and values of a header together.
	MaxHeaderBytes = 64 << 10
)

// errHeaderTooLarge is wrapped by the error for a header over its bounds.
var errHeaderTooLarge = fmt.Errorf("header over %d entries or %d bytes", MaxHeaderEntries, MaxHeaderBytes)

// readStringMap reads a map of str to str (nil reads as a nil map) of at
// most MaxHeaderEntries entries and MaxHeaderBytes bytes.
func readStringMap(b []byte) (map[string]string, []byte, error) {
	if msgp.IsNil(b) {
		return nil, b[1:], nil
	}
	n, b, err := readMapHeader(b)
	if err != nil {
		return nil, nil, err
	}
	if n > MaxHeaderEntries {
		return nil, nil, fmt.Errorf("%w: %d entries", errHeaderTooLarge, n)
	}
	// Not sized from n: a declared count is not bytes that are there.
	h := make(map[string]string)
	size := 0
	for range n {
		var k, v string
		if k, b, err = readString(b); err != nil {
			return nil, nil, err
		}
		if v, b, err = readString(b); err != nil {
			return nil, nil, err
		}
		if size += len(k) + len(v); size > MaxHeaderBytes {
			return nil, nil, fmt.Errorf("%w: %d bytes", errHeaderTooLarge, size)
		}
		h[k] = v
	}
	return h, b, nil
}
