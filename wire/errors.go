package wire

import (
	"errors"
	"fmt"
)

// ErrCode is a protocol error code: carried by GoAway and Error frames and
// by ConnError and StreamError, and the one table of codes the rdma
// channels use in their control replies and staging frames (an ErrorTable
// maps them to and from sentinel errors).
type ErrCode uint32

// Error codes.
const (
	CodeNoError     ErrCode = 0  // no error; a graceful close
	CodeProtocol    ErrCode = 1  // the peer broke the protocol
	CodeInternal    ErrCode = 2  // an internal failure of the sender
	CodeFrameSize   ErrCode = 3  // a frame too large or too short
	CodeAuth        ErrCode = 4  // authentication failed
	CodeVersion     ErrCode = 5  // unsupported protocol version
	CodeCluster     ErrCode = 6  // cluster names differ
	CodeNotFound    ErrCode = 7  // no such actor, export or transfer
	CodeReleased    ErrCode = 8  // the lease is not (or no longer) valid for the export
	CodeOutOfRange  ErrCode = 9  // offset or length outside the exported region
	CodeCancelled   ErrCode = 10 // the request or transfer was cancelled
	CodeTimeout     ErrCode = 11 // a deadline passed
	CodeUnavailable ErrCode = 12 // the resource is temporarily unavailable
	CodeShutdown    ErrCode = 13 // the node (or its tensor store) is shutting down
	CodeStale       ErrCode = 14 // the export belongs to another incarnation of its owner
	CodeClosed      ErrCode = 15 // the channel that would serve the request is closed
	CodeIdle        ErrCode = 16 // the connection closes after its idle timeout; the node stays
)

var errCodeNames = [...]string{
	CodeNoError:     "NoError",
	CodeProtocol:    "Protocol",
	CodeInternal:    "Internal",
	CodeFrameSize:   "FrameSize",
	CodeAuth:        "Auth",
	CodeVersion:     "Version",
	CodeCluster:     "Cluster",
	CodeNotFound:    "NotFound",
	CodeReleased:    "Released",
	CodeOutOfRange:  "OutOfRange",
	CodeCancelled:   "Cancelled",
	CodeTimeout:     "Timeout",
	CodeUnavailable: "Unavailable",
	CodeShutdown:    "Shutdown",
	CodeStale:       "Stale",
	CodeClosed:      "Closed",
	CodeIdle:        "Idle",
}

// String returns the code's name, or "ErrCode(n)" for an unknown code.
func (c ErrCode) String() string {
	if int(c) < len(errCodeNames) {
		return errCodeNames[c]
	}
	return fmt.Sprintf("ErrCode(%d)", uint32(c))
}

// Sentinel errors. They are returned wrapped (in a *ConnError, a *StreamError
// or with fmt.Errorf's %w); test for them with errors.Is.
var (
	// ErrFrameTooLarge: a frame's declared length exceeds the maximum.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrShortFrame: a frame was truncated, or its payload is shorter than
	// its type requires.
	ErrShortFrame = errors.New("wire: short frame")
	// ErrBadHeader: a frame header has reserved bits set.
	ErrBadHeader = errors.New("wire: bad frame header")
	// ErrBadBody: a frame body is not valid msgpack for its type.
	ErrBadBody = errors.New("wire: bad frame body")
	// ErrAuthFailed: the handshake's HMAC check failed (wrong secret,
	// replay or tampering).
	ErrAuthFailed = errors.New("wire: authentication failed")
	// ErrVersion: the peers speak different protocol versions.
	ErrVersion = errors.New("wire: protocol version mismatch")
	// ErrClusterMismatch: the peers belong to different clusters.
	ErrClusterMismatch = errors.New("wire: cluster mismatch")
	// ErrUnexpectedPeer: the acceptor authenticated as a node other than
	// HandshakeConfig.Expect.
	ErrUnexpectedPeer = errors.New("wire: unexpected peer")
	// ErrClosed: the connection is closed.
	ErrClosed = errors.New("wire: connection closed")
)

// ConnError is an error that kills the whole connection. Err, when set, is
// the underlying cause (often a sentinel) and is returned by Unwrap.
type ConnError struct {
	Code   ErrCode
	Reason string
	Err    error
}

// Error implements error.
func (e *ConnError) Error() string {
	msg := "wire: connection error " + e.Code.String()
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *ConnError) Unwrap() error { return e.Err }

// StreamError is an error that fails a single request or transfer (the
// stream) and leaves the connection usable.
type StreamError struct {
	Stream uint32
	Code   ErrCode
	Cause  error
}

// Error implements error.
func (e *StreamError) Error() string {
	msg := fmt.Sprintf("wire: stream %d error %s", e.Stream, e.Code)
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *StreamError) Unwrap() error { return e.Cause }

func connErr(code ErrCode, sentinel error, format string, args ...any) *ConnError {
	return &ConnError{Code: code, Reason: fmt.Sprintf(format, args...), Err: sentinel}
}

// remoteError is the message a peer sent with an error code.
type remoteError struct{ msg string }

func (e *remoteError) Error() string { return "peer says: " + e.msg }

// StreamError returns the error an Error frame reports, for the stream it
// names.
func (f *ErrorFrame) StreamError() *StreamError {
	return &StreamError{Stream: f.Error.Stream, Code: f.Error.Code, Cause: &remoteError{f.Error.Msg}}
}

// CodeError is one entry of an ErrorTable: the code of a sending side's
// error that matches Sent (with errors.Is), and the sentinel that the
// receiving side's error then wraps: Received, or Sent when Received is
// nil.
type CodeError struct {
	Code     ErrCode
	Sent     error
	Received error
}

// ErrorTable maps errors to codes on the sending side and codes back to
// sentinels on the receiving side, so that errors.Is finds at the receiver
// the sentinel the sender met. Entries are matched in order. It is
// immutable and safe for concurrent use.
type ErrorTable struct {
	entries []CodeError
}

// NewErrorTable returns the table of entries. An entry with a nil Sent is
// left out.
func NewErrorTable(entries ...CodeError) *ErrorTable {
	t := &ErrorTable{}
	for _, e := range entries {
		if e.Sent == nil {
			continue
		}
		if e.Received == nil {
			e.Received = e.Sent
		}
		t.entries = append(t.entries, e)
	}
	return t
}

// Code returns the code of err: CodeNoError for nil, the code of the first
// entry whose Sent err matches, and CodeInternal for any other error.
func (t *ErrorTable) Code(err error) ErrCode {
	if err == nil {
		return CodeNoError
	}
	for _, e := range t.entries {
		if errors.Is(err, e.Sent) {
			return e.Code
		}
	}
	return CodeInternal
}

// Sentinel returns the sentinel the receiver's error wraps for code c, or
// nil if the table has none for it (CodeNoError, CodeInternal, a code this
// table does not use).
func (t *ErrorTable) Sentinel(c ErrCode) error {
	for _, e := range t.entries {
		if e.Code == c {
			return e.Received
		}
	}
	return nil
}
