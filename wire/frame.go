package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/tensorferry/tensorferry/config"
)

// HeaderSize is the size of the fixed frame header: length uint32, type
// uint8, flags uint8, reserved uint16 (zero), stream id uint32, big endian.
// Length counts the payload only.
const HeaderSize = 12

const (
	// DefaultMaxFrameSize is the default largest payload accepted, 16 MiB:
	// the transport section's default (config.DefaultMaxFrameSize).
	DefaultMaxFrameSize = config.DefaultMaxFrameSize
	// MaxFrameSizeLimit is the largest payload size a Framer can be set to
	// (1 GiB, config.MaxMaxFrameSize).
	MaxFrameSizeLimit = config.MaxMaxFrameSize
)

// FrameType identifies the kind of a frame.
type FrameType uint8

// Frame types.
const (
	FrameHello     FrameType = 1
	FrameChallenge FrameType = 2
	FrameAuth      FrameType = 3
	FrameWelcome   FrameType = 4
	FrameMessage   FrameType = 5
	FrameSystem    FrameType = 6
	FramePing      FrameType = 7
	FramePong      FrameType = 8
	FrameGoAway    FrameType = 9
	FrameError     FrameType = 10
	// 11, 12 and 13 are reserved: they were FETCH, DATA and FETCH_END, a
	// control-plane data path that tensors no longer take (they ride an
	// rdma channel). Frames of those types are read as *UnknownFrame.
	FrameRelease  FrameType = 14
	FrameCaps     FrameType = 15
	FrameMessages FrameType = 16
)

var frameTypeNames = [...]string{
	FrameHello:     "HELLO",
	FrameChallenge: "CHALLENGE",
	FrameAuth:      "AUTH",
	FrameWelcome:   "WELCOME",
	FrameMessage:   "MESSAGE",
	FrameSystem:    "SYSTEM",
	FramePing:      "PING",
	FramePong:      "PONG",
	FrameGoAway:    "GOAWAY",
	FrameError:     "ERROR",
	FrameRelease:   "RELEASE",
	FrameCaps:      "CAPS",
	FrameMessages:  "MESSAGES",
}

// String returns the type's name, or "UNKNOWN_FRAME_TYPE_n".
func (t FrameType) String() string {
	if int(t) < len(frameTypeNames) && frameTypeNames[t] != "" {
		return frameTypeNames[t]
	}
	return fmt.Sprintf("UNKNOWN_FRAME_TYPE_%d", uint8(t))
}

// isHandshake reports whether t may only appear during the handshake.
func (t FrameType) isHandshake() bool {
	return t >= FrameHello && t <= FrameWelcome
}

// Flags are the per-frame flag bits.
type Flags uint8

// Frame flags.
const (
	// FlagEndStream marks the last frame of a stream (an Error, a final
	// response).
	FlagEndStream Flags = 0x1
)

// Has reports whether all bits of v are set in f.
func (f Flags) Has(v Flags) bool { return f&v == v }

// String lists the set flags, e.g. "END_STREAM|0x80".
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var parts []string
	if f.Has(FlagEndStream) {
		parts = append(parts, "END_STREAM")
		f &^= FlagEndStream
	}
	if f != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint8(f)))
	}
	return strings.Join(parts, "|")
}

// FrameHeader is the decoded fixed header of a frame.
type FrameHeader struct {
	Length uint32 // payload bytes, header excluded
	Type   FrameType
	Flags  Flags
	Stream uint32
}

// Header returns h; it makes every frame type that embeds FrameHeader a
// Frame.
func (h FrameHeader) Header() FrameHeader { return h }

// String formats the header for logs.
func (h FrameHeader) String() string {
	return fmt.Sprintf("[%s flags=%s stream=%d len=%d]", h.Type, h.Flags, h.Stream, h.Length)
}

func putHeader(b []byte, t FrameType, flags Flags, stream uint32, length uint32) {
	binary.BigEndian.PutUint32(b[0:4], length)
	b[4] = byte(t)
	b[5] = byte(flags)
	b[6], b[7] = 0, 0
	binary.BigEndian.PutUint32(b[8:12], stream)
}

// Frame is a decoded frame: one of *HelloFrame, *ChallengeFrame, *AuthFrame,
// *WelcomeFrame, *MessageFrame, *SystemFrame, *PingFrame, *PongFrame,
// *GoAwayFrame, *ErrorFrame, *ReleaseFrame, *CapsFrame, *MessagesFrame or
// *UnknownFrame.
type Frame interface {
	Header() FrameHeader
}

// Typed frames. Their decoded bodies own their memory, except
// UnknownFrame.Payload and MessagesFrame, which alias the Framer's buffers.
type (
	// HelloFrame is a FrameHello.
	HelloFrame struct {
		FrameHeader
		Hello Hello
	}
	// ChallengeFrame is a FrameChallenge.
	ChallengeFrame struct {
		FrameHeader
		Challenge Challenge
	}
	// AuthFrame is a FrameAuth.
	AuthFrame struct {
		FrameHeader
		Auth Auth
	}
	// WelcomeFrame is a FrameWelcome.
	WelcomeFrame struct {
		FrameHeader
		Welcome Welcome
	}
	// MessageFrame is a FrameMessage.
	MessageFrame struct {
		FrameHeader
		Message Message
	}
	// MessagesFrame is a FrameMessages: a batch of messages, in the order
	// they were sent. The frame, its Messages and their Bodies belong to
	// the Framer and are valid only until the next ReadFrame (in a Conn
	// Handler: until the Handler returns); their strings stay valid.
	MessagesFrame struct {
		FrameHeader
		Messages []Message
	}
	// SystemFrame is a FrameSystem.
	SystemFrame struct {
		FrameHeader
		System System
	}
	// PingFrame is a FramePing.
	PingFrame struct {
		FrameHeader
		Ping Ping
	}
	// PongFrame is a FramePong.
	PongFrame struct {
		FrameHeader
		Pong Pong
	}
	// GoAwayFrame is a FrameGoAway.
	GoAwayFrame struct {
		FrameHeader
		GoAway GoAway
	}
	// ErrorFrame is a FrameError.
	ErrorFrame struct {
		FrameHeader
		Error Error
	}
	// ReleaseFrame is a FrameRelease.
	ReleaseFrame struct {
		FrameHeader
		Release Release
	}
	// CapsFrame is a FrameCaps.
	CapsFrame struct {
		FrameHeader
		Caps Caps
	}
	// UnknownFrame is a frame of a type this package does not know. Payload
	// aliases the Framer's read buffer: it is valid only until the next
	// ReadFrame. The caller decides whether to ignore it or fail.
	UnknownFrame struct {
		FrameHeader
		Payload []byte
	}
)

// frameParser decodes the payload of one frame type.
type frameParser func(h FrameHeader, payload []byte) (Frame, error)

var frameParsers = [...]frameParser{
	FrameHello: func(h FrameHeader, p []byte) (Frame, error) {
		f := &HelloFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Hello)
	},
	FrameChallenge: func(h FrameHeader, p []byte) (Frame, error) {
		f := &ChallengeFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Challenge)
	},
	FrameAuth: func(h FrameHeader, p []byte) (Frame, error) {
		f := &AuthFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Auth)
	},
	FrameWelcome: func(h FrameHeader, p []byte) (Frame, error) {
		f := &WelcomeFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Welcome)
	},
	FrameSystem: func(h FrameHeader, p []byte) (Frame, error) {
		f := &SystemFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.System)
	},
	FramePing: func(h FrameHeader, p []byte) (Frame, error) {
		f := &PingFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Ping)
	},
	FramePong: func(h FrameHeader, p []byte) (Frame, error) {
		f := &PongFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Pong)
	},
	FrameGoAway: func(h FrameHeader, p []byte) (Frame, error) {
		f := &GoAwayFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.GoAway)
	},
	FrameError: func(h FrameHeader, p []byte) (Frame, error) {
		f := &ErrorFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Error)
	},
	FrameRelease: func(h FrameHeader, p []byte) (Frame, error) {
		f := &ReleaseFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Release)
	},
	FrameCaps: func(h FrameHeader, p []byte) (Frame, error) {
		f := &CapsFrame{FrameHeader: h}
		return f, decodeBody(h, p, &f.Caps)
	},
}

func decodeBody(h FrameHeader, p []byte, v any) error {
	if err := DecodeMsgpack(p, v); err != nil {
		return bodyError(h, err)
	}
	return nil
}

func bodyError(h FrameHeader, err error) error {
	return &ConnError{Code: CodeProtocol, Reason: fmt.Sprintf("%s frame on stream %d", h.Type, h.Stream), Err: err}
}

// Framer reads and writes frames. It keeps no connection state. Its read
// side (ReadFrame) and write side (Write*) may each be used by one
// goroutine at a time, concurrently with each other.
type Framer struct {
	w        io.Writer
	r        io.Reader
	maxRead  uint32
	maxWrite uint32
	hdr      [HeaderSize]byte
	rbuf     []byte
	wbuf     []byte
	strs     stringCache   // read side: strings repeated across messages
	batch    MessagesFrame // reused by every FrameMessages read
	// reuseMsg: a FrameMessage is read into msg, its body aliasing rbuf
	// (ConnOptions.TransientMessages); msg is made on first use.
	reuseMsg bool
	msg      *MessageFrame
}

// disown leaves the frame and the read buffer last returned to their
// holder: the next ReadFrame reads into new ones.
func (fr *Framer) disown() {
	fr.msg = nil
	fr.rbuf = nil
}

// NewFramer returns a Framer that writes to w and reads from r. Either may
// be nil if that side is not used. Reads from r are exact (header, then
// payload), so r need not be buffered, and a Framer never reads past the
// frame it returns.
func NewFramer(w io.Writer, r io.Reader) *Framer {
	return &Framer{w: w, r: r, maxRead: DefaultMaxFrameSize, maxWrite: DefaultMaxFrameSize}
}

func clampFrameSize(n uint32) uint32 {
	if n == 0 {
		return DefaultMaxFrameSize
	}
	if n > MaxFrameSizeLimit {
		return MaxFrameSizeLimit
	}
	return n
}

// SetMaxReadFrameSize sets the largest payload ReadFrame accepts; 0 means
// DefaultMaxFrameSize, larger than MaxFrameSizeLimit means
// MaxFrameSizeLimit.
func (fr *Framer) SetMaxReadFrameSize(n uint32) { fr.maxRead = clampFrameSize(n) }

// SetMaxWriteFrameSize sets the largest payload the Write methods send; the
// same rules as SetMaxReadFrameSize apply.
func (fr *Framer) SetMaxWriteFrameSize(n uint32) { fr.maxWrite = clampFrameSize(n) }

// readChunk is the first allocation for a payload larger than the read
// buffer; the buffer then doubles while bytes keep arriving, so memory is
// bounded by what the peer actually sent, not by what it declared.
const readChunk = 32 << 10

// ReadFrame reads the next frame. It returns io.EOF if the stream ended
// cleanly before a header, and otherwise a *ConnError for a frame that
// cannot be read: ErrShortFrame (truncated), ErrFrameTooLarge (length above
// the maximum, checked before any allocation), ErrBadHeader (reserved bits
// set) or ErrBadBody (a body that is not valid msgpack for its type). An
// unknown type is returned as *UnknownFrame, not an error. I/O errors are
// returned as they are.
//
// Decoded bodies own their memory. UnknownFrame.Payload and a
// *MessagesFrame alias buffers that the next ReadFrame overwrites.
func (fr *Framer) ReadFrame() (Frame, error) {
	if n, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, connErr(CodeFrameSize, ErrShortFrame, "header truncated after %d bytes", n)
		}
		return nil, err
	}
	h := FrameHeader{
		Length: binary.BigEndian.Uint32(fr.hdr[0:4]),
		Type:   FrameType(fr.hdr[4]),
		Flags:  Flags(fr.hdr[5]),
		Stream: binary.BigEndian.Uint32(fr.hdr[8:12]),
	}
	if fr.hdr[6] != 0 || fr.hdr[7] != 0 {
		return nil, connErr(CodeProtocol, ErrBadHeader, "reserved bits %#04x in %s", binary.BigEndian.Uint16(fr.hdr[6:8]), h)
	}
	if h.Length > fr.maxRead {
		return nil, connErr(CodeFrameSize, ErrFrameTooLarge, "%s exceeds %d bytes", h, fr.maxRead)
	}
	payload, err := fr.readPayload(int(h.Length))
	if err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, connErr(CodeFrameSize, ErrShortFrame, "%s payload truncated", h)
		}
		return nil, err
	}
	switch h.Type {
	case FrameMessage:
		return fr.parseMessage(h, payload)
	case FrameMessages:
		return fr.parseMessages(h, payload)
	}
	if int(h.Type) < len(frameParsers) && frameParsers[h.Type] != nil {
		f, err := frameParsers[h.Type](h, payload)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	return &UnknownFrame{FrameHeader: h, Payload: payload}, nil
}

func (fr *Framer) readPayload(n int) ([]byte, error) {
	if n <= cap(fr.rbuf) {
		fr.rbuf = fr.rbuf[:n]
		_, err := io.ReadFull(fr.r, fr.rbuf)
		return fr.rbuf, err
	}
	// Grow while reading: never allocate more than twice what arrived.
	buf := fr.rbuf[:cap(fr.rbuf)]
	got := 0
	for got < n {
		if got == len(buf) {
			size := max(2*len(buf), readChunk)
			size = min(size, n)
			nb := make([]byte, size)
			copy(nb, buf[:got])
			buf = nb
		}
		end := min(len(buf), n)
		m, err := io.ReadFull(fr.r, buf[got:end])
		got += m
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			fr.rbuf = buf[:0]
			return nil, err
		}
	}
	fr.rbuf = buf[:n]
	return fr.rbuf, nil
}

func appendFrame(dst []byte, t FrameType, flags Flags, stream uint32, body any, maxSize uint32) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, HeaderSize)...)
	if body != nil {
		var err error
		if dst, err = appendBody(dst, body); err != nil {
			return dst[:start], err
		}
	}
	return sealFrame(dst, start, t, flags, stream, maxSize)
}

// sealFrame writes the header of the frame that starts at dst[start] and
// whose payload runs to the end of dst.
func sealFrame(dst []byte, start int, t FrameType, flags Flags, stream uint32, maxSize uint32) ([]byte, error) {
	n := len(dst) - start - HeaderSize
	if n > int(maxSize) {
		return dst[:start], fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrFrameTooLarge, t, n, maxSize)
	}
	putHeader(dst[start:], t, flags, stream, uint32(n))
	return dst, nil
}

func (fr *Framer) writeBody(t FrameType, flags Flags, stream uint32, body any) error {
	var err error
	fr.wbuf, err = appendFrame(fr.wbuf[:0], t, flags, stream, body, fr.maxWrite)
	return fr.flushWriteBuf(err)
}

// flushWriteBuf writes the frame in the write buffer unless err is set.
func (fr *Framer) flushWriteBuf(err error) error {
	if err != nil {
		return err
	}
	_, err = fr.w.Write(fr.wbuf)
	fr.shrinkWriteBuf()
	return err
}

// shrinkWriteBuf drops a write buffer grown by one exceptional frame.
func (fr *Framer) shrinkWriteBuf() {
	if cap(fr.wbuf) > 1<<20 {
		fr.wbuf = nil
	}
}

// WriteFrame writes a frame with a raw payload in one Write call. It
// returns ErrFrameTooLarge (wrapped) if the payload exceeds the maximum
// write size.
func (fr *Framer) WriteFrame(t FrameType, flags Flags, stream uint32, payload []byte) error {
	var err error
	fr.wbuf = append(append(fr.wbuf[:0], make([]byte, HeaderSize)...), payload...)
	fr.wbuf, err = sealFrame(fr.wbuf, 0, t, flags, stream, fr.maxWrite)
	return fr.flushWriteBuf(err)
}

// WriteBody writes a frame whose payload is the msgpack encoding of body,
// in one Write call.
func (fr *Framer) WriteBody(t FrameType, flags Flags, stream uint32, body any) error {
	return fr.writeBody(t, flags, stream, body)
}

// WriteHello writes a Hello frame (stream 0).
func (fr *Framer) WriteHello(b *Hello) error { return fr.writeBody(FrameHello, 0, 0, b) }

// WriteChallenge writes a Challenge frame (stream 0).
func (fr *Framer) WriteChallenge(b *Challenge) error {
	return fr.writeBody(FrameChallenge, 0, 0, b)
}

// WriteAuth writes an Auth frame (stream 0).
func (fr *Framer) WriteAuth(b *Auth) error { return fr.writeBody(FrameAuth, 0, 0, b) }

// WriteWelcome writes a Welcome frame (stream 0).
func (fr *Framer) WriteWelcome(b *Welcome) error { return fr.writeBody(FrameWelcome, 0, 0, b) }

// WriteCaps writes a Caps frame (stream 0).
func (fr *Framer) WriteCaps(b *Caps) error { return fr.writeBody(FrameCaps, 0, 0, b) }

// WriteMessage writes a Message frame on stream (0 for a one-way message).
func (fr *Framer) WriteMessage(stream uint32, b *Message) error {
	return fr.writeBody(FrameMessage, 0, stream, b)
}

// WriteSystem writes a System frame (stream 0).
func (fr *Framer) WriteSystem(b *System) error { return fr.writeBody(FrameSystem, 0, 0, b) }

// WritePing writes a Ping frame (stream 0).
func (fr *Framer) WritePing(b *Ping) error { return fr.writeBody(FramePing, 0, 0, b) }

// WritePong writes a Pong frame (stream 0).
func (fr *Framer) WritePong(b *Pong) error { return fr.writeBody(FramePong, 0, 0, b) }

// WriteGoAway writes a GoAway frame (stream 0).
func (fr *Framer) WriteGoAway(b *GoAway) error { return fr.writeBody(FrameGoAway, 0, 0, b) }

// WriteError writes an Error frame on the stream it names (b.Stream), with
// FlagEndStream.
func (fr *Framer) WriteError(b *Error) error {
	return fr.writeBody(FrameError, FlagEndStream, b.Stream, b)
}

// WriteRelease writes a Release frame (stream 0).
func (fr *Framer) WriteRelease(b *Release) error { return fr.writeBody(FrameRelease, 0, 0, b) }
