package rdma_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

func TestControlErrors(t *testing.T) {
	bad := errors.New("x: bad control message")
	own := errors.New("x: own")
	codes := rdma.ControlErrors(bad, wire.CodeError{Code: wire.CodeUnavailable, Sent: own})
	cases := []struct {
		owner, fetcher error
		code           wire.ErrCode
	}{
		{tensor.ErrUnknownExport, tensor.ErrUnknownExport, wire.CodeNotFound},
		{tensor.ErrBadLease, tensor.ErrBadLease, wire.CodeReleased},
		{tensor.ErrStale, tensor.ErrStale, wire.CodeStale},
		{tensor.ErrStoreClosed, tensor.ErrStoreClosed, wire.CodeShutdown},
		{memory.ErrOutOfRange, memory.ErrOutOfRange, wire.CodeOutOfRange},
		{rdma.ErrClosed, rdma.ErrPeerDown, wire.CodeClosed},
		{bad, bad, wire.CodeProtocol},
		{own, own, wire.CodeUnavailable},
	}
	for _, c := range cases {
		got := codes.Code(fmt.Errorf("wrapped: %w", c.owner))
		if got != c.code {
			t.Errorf("Code(%v) = %v, want %v", c.owner, got, c.code)
		}
		if err := rdma.ReplyError(codes, "x", "a", got, "why"); !errors.Is(err, c.fetcher) {
			t.Errorf("ReplyError(%v) = %v, want one wrapping %v", got, err, c.fetcher)
		}
	}
	if got := codes.Code(errors.New("other")); got != wire.CodeInternal {
		t.Errorf("unknown error: code %v", got)
	}
	if err := rdma.ReplyError(codes, "x", "a", rdma.CodeOK, ""); err != nil {
		t.Errorf("CodeOK: %v", err)
	}
	if err := rdma.ReplyError(codes, "x", "a", 200, "why"); err == nil || err.Error() != "x: owner a: why" {
		t.Errorf("unknown code: %v", err)
	}
	// Without a sentinel for malformed messages, CodeProtocol has none.
	if err := rdma.ReplyError(rdma.ControlErrors(nil), "x", "a", wire.CodeProtocol, "why"); err == nil || err.Error() != "x: owner a: why" {
		t.Errorf("CodeProtocol without a sentinel: %v", err)
	}
}
