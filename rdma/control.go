package rdma

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/tensor"
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

// Reply codes shared by the channels' control protocols; a channel numbers
// its own codes from CodeChannel on.
const (
	CodeOK uint8 = iota
	CodeUnknownExport
	CodeBadLease
	CodeStale
	CodeStoreClosed
	CodeClosed
	CodeBadRequest
	CodeChannel
)

// ControlCode pairs a reply code with the sentinel the owner met and the
// one the fetcher's error wraps.
type ControlCode struct {
	Code           uint8
	Owner, Fetcher error
}

// ControlCodes translates an owner's errors into reply codes, and reply
// codes back into errors wrapping the same sentinels on the fetcher.
type ControlCodes struct {
	codes  []ControlCode
	failed uint8
}

// NewControlCodes returns the shared codes (bad is the channel's sentinel
// for malformed control messages; an owner closed is rdma.ErrPeerDown to
// its fetcher) followed by the channel's own; failed is the code of any
// other error.
func NewControlCodes(bad error, failed uint8, own ...ControlCode) *ControlCodes {
	codes := []ControlCode{
		{CodeUnknownExport, tensor.ErrUnknownExport, tensor.ErrUnknownExport},
		{CodeBadLease, tensor.ErrBadLease, tensor.ErrBadLease},
		{CodeStale, tensor.ErrStale, tensor.ErrStale},
		{CodeStoreClosed, tensor.ErrStoreClosed, tensor.ErrStoreClosed},
		{CodeClosed, ErrClosed, ErrPeerDown},
		{CodeBadRequest, bad, bad},
	}
	return &ControlCodes{codes: append(codes, own...), failed: failed}
}

// Code returns the reply code of an owner-side error.
func (t *ControlCodes) Code(err error) uint8 {
	for _, c := range t.codes {
		if errors.Is(err, c.Owner) {
			return c.Code
		}
	}
	return t.failed
}

// Err rebuilds the error of a reply from owner (nil for CodeOK), prefixed
// with the channel's name and wrapping the code's sentinel.
func (t *ControlCodes) Err(channel, owner string, code uint8, msg string) error {
	if code == CodeOK {
		return nil
	}
	for _, c := range t.codes {
		if c.Code == code {
			return fmt.Errorf("%s: owner %s: %w (%s)", channel, owner, c.Fetcher, msg)
		}
	}
	return fmt.Errorf("%s: owner %s: %s", channel, owner, msg)
}
