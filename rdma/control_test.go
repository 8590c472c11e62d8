package rdma_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

func TestControlCodes(t *testing.T) {
	bad := errors.New("x: bad control message")
	own := errors.New("x: own")
	codes := rdma.NewControlCodes(bad, rdma.CodeChannel+1, rdma.ControlCode{Code: rdma.CodeChannel, Owner: own, Fetcher: own})
	cases := []struct {
		owner, fetcher error
		code           uint8
	}{
		{tensor.ErrUnknownExport, tensor.ErrUnknownExport, rdma.CodeUnknownExport},
		{tensor.ErrBadLease, tensor.ErrBadLease, rdma.CodeBadLease},
		{tensor.ErrStale, tensor.ErrStale, rdma.CodeStale},
		{tensor.ErrStoreClosed, tensor.ErrStoreClosed, rdma.CodeStoreClosed},
		{rdma.ErrClosed, rdma.ErrPeerDown, rdma.CodeClosed},
		{bad, bad, rdma.CodeBadRequest},
		{own, own, rdma.CodeChannel},
	}
	for _, c := range cases {
		got := codes.Code(fmt.Errorf("wrapped: %w", c.owner))
		if got != c.code {
			t.Errorf("Code(%v) = %d, want %d", c.owner, got, c.code)
		}
		if err := codes.Err("x", "a", got, "why"); !errors.Is(err, c.fetcher) {
			t.Errorf("Err(%d) = %v, want one wrapping %v", got, err, c.fetcher)
		}
	}
	if got := codes.Code(errors.New("other")); got != rdma.CodeChannel+1 {
		t.Errorf("unknown error: code %d", got)
	}
	if err := codes.Err("x", "a", rdma.CodeOK, ""); err != nil {
		t.Errorf("CodeOK: %v", err)
	}
	if err := codes.Err("x", "a", 200, "why"); err == nil || err.Error() != "x: owner a: why" {
		t.Errorf("unknown code: %v", err)
	}
}
