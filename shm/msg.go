package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The upgrade's messages, exchanged on the authenticated socket right after
// the handshake (see Upgrade): offer (initiator), accept (acceptor),
// confirm (initiator), start (acceptor). Each is
//
//	"TFSM" | length uint16 (big endian, of what follows) | kind uint8 | ok uint8 |
//	nonce [16] | ring size uint32 | host, name, reason: each uint8 length + bytes
//
// and at most maxMsgSize bytes long in all.
const (
	msgOffer uint8 = iota + 1
	msgAccept
	msgConfirm
	msgStart
)

const (
	msgMagic    = "TFSM"
	msgHeadSize = len(msgMagic) + 2
	msgFixed    = 2 + nonceSize + 4
	// maxMsgSize bounds a message: the fixed part and three strings.
	maxMsgSize = msgHeadSize + msgFixed + 3*(1+maxMsgString)
	// maxMsgString bounds each string field.
	maxMsgString = 255
)

var msgNames = [...]string{msgOffer: "offer", msgAccept: "accept", msgConfirm: "confirm", msgStart: "start"}

// msg is one upgrade message. Fields a kind does not use are zero.
type msg struct {
	kind     uint8
	ok       bool
	nonce    [nonceSize]byte // offer: the initiator's; accept: the region header's
	ringSize uint32          // accept
	host     string          // offer: the initiator's host id
	name     string          // accept: the region's name
	reason   string          // !ok: why not, for the peer's log
}

// appendMsg appends the encoding of m; strings longer than maxMsgString
// bytes are cut.
func appendMsg(dst []byte, m *msg) []byte {
	start := len(dst)
	dst = append(dst, msgMagic...)
	dst = append(dst, 0, 0)
	ok := uint8(0)
	if m.ok {
		ok = 1
	}
	dst = append(dst, m.kind, ok)
	dst = append(dst, m.nonce[:]...)
	dst = binary.BigEndian.AppendUint32(dst, m.ringSize)
	for _, s := range []string{m.host, m.name, m.reason} {
		if len(s) > maxMsgString {
			s = s[:maxMsgString]
		}
		dst = append(dst, uint8(len(s)))
		dst = append(dst, s...)
	}
	binary.BigEndian.PutUint16(dst[start+len(msgMagic):], uint16(len(dst)-start-msgHeadSize))
	return dst
}

var errMsg = errors.New("shm: malformed upgrade message")

// decodeMsg decodes the body of a message (what follows the magic and the
// length).
func decodeMsg(b []byte) (msg, error) {
	var m msg
	if len(b) < msgFixed {
		return m, fmt.Errorf("%w: %d bytes, want at least %d", errMsg, len(b), msgFixed)
	}
	m.kind = b[0]
	if m.kind < msgOffer || m.kind > msgStart {
		return m, fmt.Errorf("%w: kind %d", errMsg, m.kind)
	}
	switch b[1] {
	case 0:
	case 1:
		m.ok = true
	default:
		return m, fmt.Errorf("%w: ok byte %d", errMsg, b[1])
	}
	copy(m.nonce[:], b[2:])
	m.ringSize = binary.BigEndian.Uint32(b[2+nonceSize:])
	b = b[msgFixed:]
	for _, s := range []*string{&m.host, &m.name, &m.reason} {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return m, fmt.Errorf("%w: truncated string", errMsg)
		}
		*s = string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
	}
	if len(b) != 0 {
		return m, fmt.Errorf("%w: %d bytes after the last field", errMsg, len(b))
	}
	return m, nil
}

// readMsg reads one message of kind want from r.
func readMsg(r io.Reader, want uint8) (msg, error) {
	var buf [maxMsgSize]byte
	if _, err := io.ReadFull(r, buf[:msgHeadSize]); err != nil {
		return msg{}, fmt.Errorf("shm: read %s: %w", msgNames[want], err)
	}
	if string(buf[:len(msgMagic)]) != msgMagic {
		return msg{}, fmt.Errorf("%w: magic %q", errMsg, buf[:len(msgMagic)])
	}
	n := int(binary.BigEndian.Uint16(buf[len(msgMagic):]))
	if n > maxMsgSize-msgHeadSize {
		return msg{}, fmt.Errorf("%w: %d bytes, at most %d", errMsg, n, maxMsgSize-msgHeadSize)
	}
	body := buf[msgHeadSize : msgHeadSize+n]
	if _, err := io.ReadFull(r, body); err != nil {
		return msg{}, fmt.Errorf("shm: read %s: %w", msgNames[want], err)
	}
	m, err := decodeMsg(body)
	if err != nil {
		return m, err
	}
	if m.kind != want {
		return m, fmt.Errorf("%w: got %s, want %s", errMsg, msgNames[m.kind], msgNames[want])
	}
	return m, nil
}
