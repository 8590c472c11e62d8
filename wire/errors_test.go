package wire

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestErrorTable(t *testing.T) {
	gone := errors.New("x: gone")
	closed, down := errors.New("x: closed"), errors.New("x: peer down")
	table := NewErrorTable(
		CodeError{Code: CodeNotFound, Sent: gone},
		CodeError{Code: CodeClosed, Sent: closed, Received: down},
		CodeError{Code: CodeProtocol}, // no sentinel: left out
		CodeError{Code: CodeCancelled, Sent: context.Canceled},
	)
	tests := []struct {
		sent     error
		code     ErrCode
		received error
	}{
		{nil, CodeNoError, nil},
		{fmt.Errorf("wrapped: %w", gone), CodeNotFound, gone},
		{closed, CodeClosed, down},
		{context.Canceled, CodeCancelled, context.Canceled},
		{errors.New("other"), CodeInternal, nil},
	}
	for _, tc := range tests {
		c := table.Code(tc.sent)
		if c != tc.code {
			t.Errorf("Code(%v) = %v, want %v", tc.sent, c, tc.code)
		}
		if got := table.Sentinel(c); got != tc.received {
			t.Errorf("Sentinel(%v) = %v, want %v", c, got, tc.received)
		}
	}
	if got := table.Sentinel(CodeProtocol); got != nil {
		t.Errorf("Sentinel(Protocol) = %v for an entry without a sentinel", got)
	}
	if got := table.Sentinel(ErrCode(999)); got != nil {
		t.Errorf("Sentinel of an unknown code = %v", got)
	}
}
