package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/wire"
)

// The staging data protocol. Every frame starts with a 16-byte header:
//
//	type u8 | flags u8 | reserved u16 | stream u32 | length u64
//
// followed by length bytes of body. No flags are defined yet: flags and
// reserved must be zero. All integers are big-endian. Bodies:
//
//	REQUEST  export id u64, lease u64, incarnation u64, offset u64,
//	         length u64, chunk size u32, window u32       (48 bytes)
//	DATA     offset u64 (from the start of the export), then the bytes
//	END      code u32, message (at most MaxMessage bytes)  success or cancelled
//	ERROR    code u32, message (at most MaxMessage bytes)  the stream failed
//	CANCEL   empty                                         fetcher gives up
//
// The fetcher sends REQUEST and CANCEL, the owner DATA, END and ERROR. A
// stream is one transfer; its id is chosen by the fetcher and is unique on
// its connection. The format is the same whatever memory either end uses.
// Codes are wire.ErrCode values (wire.ProtocolVersion, checked when the
// connection is authenticated, covers this format too).

// FrameType is the type of a staging frame.
type FrameType uint8

// Frame types.
const (
	FrameRequest FrameType = 1
	FrameData    FrameType = 2
	FrameEnd     FrameType = 3
	FrameError   FrameType = 4
	FrameCancel  FrameType = 5
)

// String returns the frame type's name.
func (t FrameType) String() string {
	switch t {
	case FrameRequest:
		return "REQUEST"
	case FrameData:
		return "DATA"
	case FrameEnd:
		return "END"
	case FrameError:
		return "ERROR"
	case FrameCancel:
		return "CANCEL"
	}
	return "FrameType(" + strconv.Itoa(int(t)) + ")"
}

// Sizes of the protocol.
const (
	// HeaderSize is the size of a frame header in bytes.
	HeaderSize = 16
	// RequestSize is the size of a REQUEST body in bytes.
	RequestSize = 48
	// MaxMessage is the longest message an END or ERROR frame may carry.
	MaxMessage = 1024
	// statusCodeSize is the size of the code that starts a status body.
	statusCodeSize = 4
	// MaxChunkSize is the largest chunk either end accepts (64 MiB).
	MaxChunkSize = config.MaxChunkSize
	// DefaultChunkSize is the chunk size of a Request whose ChunkSize is 0
	// (4 MiB, as config.DefaultStagingConfig's).
	DefaultChunkSize = config.DefaultChunkSize
	// DefaultWindow is the window of a Request whose Window is 0 (4, as
	// config.DefaultStagingConfig's).
	DefaultWindow = config.DefaultChunksInFlight
	// MaxWindow bounds the window a request may ask for.
	MaxWindow = config.MaxChunksInFlight
)

// Errors of the frame codec. They are connection errors: the connection
// they occur on cannot be trusted any more and is closed.
var (
	ErrFrameTooLarge = errors.New("staging: frame too large")
	ErrBadFrame      = errors.New("staging: malformed frame")
)

// Header is a decoded frame header.
type Header struct {
	Type   FrameType
	Flags  uint8
	Stream uint32
	Length uint64 // body length in bytes
}

// Request asks the owner for bytes [Offset, Offset+Length) of an export.
type Request struct {
	ExportID    uint64
	Lease       uint64
	Incarnation uint64
	Offset      uint64
	Length      uint64
	ChunkSize   uint32 // bytes per DATA frame; 0 means DefaultChunkSize
	Window      uint32 // chunks the owner may stage ahead; 0 means DefaultWindow
}

// Status is the body of END and ERROR frames.
type Status struct {
	Code    wire.ErrCode // wire.CodeNoError for a successful END
	Message string
}

// Frame is a whole frame read by ReadFrame.
type Frame struct {
	Header
	Request Request // REQUEST
	Status  Status  // END, ERROR
	Offset  uint64  // DATA
	// Data holds a DATA frame's bytes; it is valid until the next read.
	Data []byte
}

// Framer reads and writes staging frames. It holds no connection state
// beyond its buffers; it is not safe for concurrent use by several readers
// or several writers (one reader and one writer may run concurrently).
type Framer struct {
	r        io.Reader
	w        io.Writer
	maxChunk int
	rhdr     [HeaderSize + RequestSize]byte
	whdr     [HeaderSize + RequestSize]byte
	data     []byte
}

// NewFramer returns a framer reading from r and writing to w. DATA frames
// larger than maxChunk bytes (plus their offset) are rejected before
// anything is allocated; maxChunk <= 0 or above MaxChunkSize means
// MaxChunkSize.
func NewFramer(r io.Reader, w io.Writer, maxChunk int) *Framer {
	if maxChunk <= 0 || maxChunk > MaxChunkSize {
		maxChunk = MaxChunkSize
	}
	return &Framer{r: r, w: w, maxChunk: maxChunk}
}

// ReadHeader reads a frame header and checks its type and length against
// the limits of that type. The caller then reads the body with ReadRequest,
// ReadStatus or ReadDataOffset (DATA bytes follow), or skips it.
func (f *Framer) ReadHeader() (Header, error) {
	b := f.rhdr[:HeaderSize]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return Header{}, err
	}
	h := Header{
		Type:   FrameType(b[0]),
		Flags:  b[1],
		Stream: binary.BigEndian.Uint32(b[4:8]),
		Length: binary.BigEndian.Uint64(b[8:16]),
	}
	if r := binary.BigEndian.Uint16(b[2:4]); r != 0 || h.Flags != 0 {
		return h, fmt.Errorf("%w: flags %#x or reserved bits %#x set (none are defined)", ErrBadFrame, h.Flags, r)
	}
	switch h.Type {
	case FrameRequest:
		if h.Length != RequestSize {
			return h, fmt.Errorf("%w: REQUEST of %d bytes, want %d", ErrBadFrame, h.Length, RequestSize)
		}
	case FrameData:
		if h.Length < 8 {
			return h, fmt.Errorf("%w: DATA of %d bytes has no offset", ErrBadFrame, h.Length)
		}
		if h.Length-8 > uint64(f.maxChunk) {
			return h, fmt.Errorf("%w: DATA of %d bytes > chunk limit %d", ErrFrameTooLarge, h.Length-8, f.maxChunk)
		}
	case FrameEnd, FrameError:
		if h.Length < statusCodeSize {
			return h, fmt.Errorf("%w: %v of %d bytes has no code", ErrBadFrame, h.Type, h.Length)
		}
		if h.Length-statusCodeSize > MaxMessage {
			return h, fmt.Errorf("%w: %v message of %d bytes > %d", ErrFrameTooLarge, h.Type, h.Length-statusCodeSize, MaxMessage)
		}
	case FrameCancel:
		if h.Length != 0 {
			return h, fmt.Errorf("%w: CANCEL with a %d-byte body", ErrBadFrame, h.Length)
		}
	default:
		return h, fmt.Errorf("%w: unknown frame type %d", ErrBadFrame, h.Type)
	}
	return h, nil
}

// ReadRequest reads the body of a REQUEST frame whose header was just read.
func (f *Framer) ReadRequest(h Header) (Request, error) {
	if h.Type != FrameRequest {
		return Request{}, fmt.Errorf("%w: %v is not a REQUEST", ErrBadFrame, h.Type)
	}
	b := f.rhdr[:RequestSize]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return Request{}, unexpectedEOF(err)
	}
	return Request{
		ExportID:    binary.BigEndian.Uint64(b[0:]),
		Lease:       binary.BigEndian.Uint64(b[8:]),
		Incarnation: binary.BigEndian.Uint64(b[16:]),
		Offset:      binary.BigEndian.Uint64(b[24:]),
		Length:      binary.BigEndian.Uint64(b[32:]),
		ChunkSize:   binary.BigEndian.Uint32(b[40:]),
		Window:      binary.BigEndian.Uint32(b[44:]),
	}, nil
}

// ReadStatus reads the body of an END or ERROR frame.
func (f *Framer) ReadStatus(h Header) (Status, error) {
	if h.Type != FrameEnd && h.Type != FrameError {
		return Status{}, fmt.Errorf("%w: %v carries no status", ErrBadFrame, h.Type)
	}
	if h.Length < statusCodeSize || h.Length-statusCodeSize > MaxMessage {
		return Status{}, fmt.Errorf("%w: status of %d bytes", ErrBadFrame, h.Length)
	}
	var buf [statusCodeSize + MaxMessage]byte
	b := buf[:h.Length]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return Status{}, unexpectedEOF(err)
	}
	return Status{Code: wire.ErrCode(binary.BigEndian.Uint32(b)), Message: string(b[statusCodeSize:])}, nil
}

// ReadDataOffset reads the offset of a DATA frame and returns it with the
// number of data bytes that follow; the caller reads exactly n bytes next
// (straight into its destination).
func (f *Framer) ReadDataOffset(h Header) (off uint64, n int, err error) {
	if h.Type != FrameData || h.Length < 8 || h.Length-8 > uint64(f.maxChunk) {
		return 0, 0, fmt.Errorf("%w: not a valid DATA header", ErrBadFrame)
	}
	b := f.rhdr[:8]
	if _, err := io.ReadFull(f.r, b); err != nil {
		return 0, 0, unexpectedEOF(err)
	}
	return binary.BigEndian.Uint64(b), int(h.Length - 8), nil
}

// ReadFrame reads a whole frame. A DATA frame's bytes go into a buffer owned
// by the framer (at most maxChunk bytes), valid until the next read.
func (f *Framer) ReadFrame() (Frame, error) {
	h, err := f.ReadHeader()
	if err != nil {
		return Frame{Header: h}, err
	}
	fr := Frame{Header: h}
	switch h.Type {
	case FrameRequest:
		fr.Request, err = f.ReadRequest(h)
	case FrameEnd, FrameError:
		fr.Status, err = f.ReadStatus(h)
	case FrameData:
		var n int
		fr.Offset, n, err = f.ReadDataOffset(h)
		if err != nil {
			break
		}
		if cap(f.data) < n {
			f.data = make([]byte, n)
		}
		fr.Data = f.data[:n]
		_, err = io.ReadFull(f.r, fr.Data)
		err = unexpectedEOF(err)
	}
	return fr, err
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func putHeader(b []byte, t FrameType, stream uint32, length uint64) {
	b[0] = byte(t)
	b[1] = 0
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], stream)
	binary.BigEndian.PutUint64(b[8:], length)
}

// WriteRequest writes a REQUEST frame in one Write.
func (f *Framer) WriteRequest(stream uint32, r Request) error {
	b := f.whdr[:HeaderSize+RequestSize]
	putHeader(b, FrameRequest, stream, RequestSize)
	p := b[HeaderSize:]
	binary.BigEndian.PutUint64(p[0:], r.ExportID)
	binary.BigEndian.PutUint64(p[8:], r.Lease)
	binary.BigEndian.PutUint64(p[16:], r.Incarnation)
	binary.BigEndian.PutUint64(p[24:], r.Offset)
	binary.BigEndian.PutUint64(p[32:], r.Length)
	binary.BigEndian.PutUint32(p[40:], r.ChunkSize)
	binary.BigEndian.PutUint32(p[44:], r.Window)
	_, err := f.w.Write(b)
	return err
}

// WriteCancel writes a CANCEL frame.
func (f *Framer) WriteCancel(stream uint32) error {
	b := f.whdr[:HeaderSize]
	putHeader(b, FrameCancel, stream, 0)
	_, err := f.w.Write(b)
	return err
}

// WriteStatus writes an END or ERROR frame; a message longer than
// MaxMessage is cut.
func (f *Framer) WriteStatus(t FrameType, stream uint32, s Status) error {
	if t != FrameEnd && t != FrameError {
		return fmt.Errorf("%w: %v carries no status", ErrBadFrame, t)
	}
	msg := s.Message
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	b := make([]byte, HeaderSize+statusCodeSize+len(msg))
	putHeader(b, t, stream, uint64(statusCodeSize+len(msg)))
	binary.BigEndian.PutUint32(b[HeaderSize:], uint32(s.Code))
	copy(b[HeaderSize+statusCodeSize:], msg)
	_, err := f.w.Write(b)
	return err
}

// WriteData writes a DATA frame carrying p at offset off. The header and p
// go out in one vectored write, without copying p.
func (f *Framer) WriteData(stream uint32, off uint64, p []byte) error {
	if len(p) > f.maxChunk {
		return fmt.Errorf("%w: DATA of %d bytes > chunk limit %d", ErrFrameTooLarge, len(p), f.maxChunk)
	}
	b := f.whdr[:HeaderSize+8]
	putHeader(b, FrameData, stream, uint64(8+len(p)))
	binary.BigEndian.PutUint64(b[HeaderSize:], off)
	bufs := net.Buffers{b, p}
	_, err := bufs.WriteTo(f.w)
	return err
}
