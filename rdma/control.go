package rdma

import (
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// DecodeControl decodes a channel's control message b (msgpack) into v,
// refusing messages longer than max bytes. Errors wrap bad, the channel's
// sentinel for malformed control messages; what names the message in them
// ("request", "reply").
func DecodeControl(b []byte, max int, v any, bad error, what string) error {
	if len(b) > max {
		return fmt.Errorf("%w: %s of %d bytes", bad, what, len(b))
	}
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %w", bad, what, err)
	}
	return nil
}

// CodeOK is the code of a successful control reply (wire.CodeNoError).
// Channels' replies and statuses carry wire.ErrCode: the codes are wire's.
const CodeOK = wire.CodeNoError

// ControlErrors returns the error table of a channel's control replies
// and statuses: the tensor store's sentinels (ErrUnknownExport as
// wire.CodeNotFound, ErrBadLease as CodeReleased, ErrStale as CodeStale,
// ErrStoreClosed as CodeShutdown), memory.ErrOutOfRange as CodeOutOfRange,
// an owner whose channel is closed (ErrClosed, CodeClosed) as ErrPeerDown
// to its fetcher, and bad (the channel's sentinel for malformed control
// messages; nil if it has none) as CodeProtocol, followed by the channel's
// own entries. Any other error is wire.CodeInternal.
func ControlErrors(bad error, own ...wire.CodeError) *wire.ErrorTable {
	entries := []wire.CodeError{
		{Code: wire.CodeNotFound, Sent: tensor.ErrUnknownExport},
		{Code: wire.CodeReleased, Sent: tensor.ErrBadLease},
		{Code: wire.CodeStale, Sent: tensor.ErrStale},
		{Code: wire.CodeShutdown, Sent: tensor.ErrStoreClosed},
		{Code: wire.CodeOutOfRange, Sent: memory.ErrOutOfRange},
		{Code: wire.CodeClosed, Sent: ErrClosed, Received: ErrPeerDown},
		{Code: wire.CodeProtocol, Sent: bad},
	}
	return wire.NewErrorTable(append(entries, own...)...)
}

// ReplyError rebuilds the error of a reply from owner: nil for CodeOK,
// otherwise an error prefixed with the channel's name that wraps the
// code's sentinel in t, when it has one, and carries the owner's message.
func ReplyError(t *wire.ErrorTable, channel, owner string, code wire.ErrCode, msg string) error {
	if code == CodeOK {
		return nil
	}
	if s := t.Sentinel(code); s != nil {
		return fmt.Errorf("%s: owner %s: %w (%s)", channel, owner, s, msg)
	}
	return fmt.Errorf("%s: owner %s: %s", channel, owner, msg)
}
