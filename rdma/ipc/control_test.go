package ipc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

func TestErrorCodesRoundTrip(t *testing.T) {
	for _, s := range []error{tensor.ErrUnknownExport, tensor.ErrBadLease, tensor.ErrStale,
		tensor.ErrStoreClosed, errBadMessage, ErrUnproven, errBusy} {
		b, err := encode(errorReply(fmt.Errorf("owner side: %w", s)))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := decodeReply(b)
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.err("o"); !errors.Is(got, s) {
			t.Errorf("%v came back as %v", s, got)
		}
	}
	rep := errorReply(rdma.ErrClosed)
	if got := rep.err("o"); !errors.Is(got, rdma.ErrPeerDown) {
		t.Errorf("closed owner: %v, want ErrPeerDown", got)
	}
	rep = errorReply(errors.New("driver on fire"))
	if got := rep.err("o"); got == nil || got.Error() != "ipc: owner o: driver on fire" {
		t.Errorf("other error: %v", got)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	enc := func(r request) []byte {
		b, err := encode(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := map[string][]byte{
		"garbage":   {0xc1},
		"unknown":   enc(request{Op: 99}),
		"no-op":     enc(request{}),
		"short-mac": enc(request{Op: opProve, MAC: []byte{1, 2}}),
		"range":     enc(request{Op: opBegin, Bytes: maxAllocSize + 1}),
		"too-long":  make([]byte, maxControlBytes+1),
	}
	for name, b := range cases {
		if _, err := decodeRequest(b); !errors.Is(err, errBadMessage) {
			t.Errorf("%s: %v, want errBadMessage", name, err)
		}
	}
	r, err := decodeRequest(enc(request{Op: opProve, Challenge: 5, MAC: bytes.Repeat([]byte{1}, macLen)}))
	if err != nil || r.Challenge != 5 {
		t.Fatalf("good prove request: %+v, %v", r, err)
	}
}

func TestDecodeReplyRejects(t *testing.T) {
	enc := func(r reply) []byte {
		b, err := encode(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := map[string][]byte{
		"garbage":   {0x92},
		"handle":    enc(reply{Handle: make([]byte, 63), MapSize: 10}),
		"no-size":   enc(reply{Handle: make([]byte, 64)}),
		"shift":     enc(reply{Handle: make([]byte, 64), MapSize: 10, Shift: 11}),
		"huge":      enc(reply{Handle: make([]byte, 64), MapSize: maxAllocSize + 1}),
		"process":   enc(reply{Process: make([]byte, 3)}),
		"device":    enc(reply{Device: -1}),
		"revoked":   enc(reply{Revoked: make([]uint64, maxRevoked+1)}),
		"path":      enc(reply{Path: string(make([]byte, maxPathLen+1))}),
		"too-long":  make([]byte, maxControlBytes+1),
		"truncated": enc(reply{Code: rdma.CodeOK, Msg: "hello"})[:3],
	}
	for name, b := range cases {
		if _, err := decodeReply(b); !errors.Is(err, errBadMessage) {
			t.Errorf("%s: %v, want errBadMessage", name, err)
		}
	}
}

// TestHandleControlBadInput: garbage gets an error reply, never a failed
// control connection or a panic.
func TestHandleControlBadInput(t *testing.T) {
	p := newFakePair(t, Config{ShmDir: t.TempDir()})
	for _, b := range [][]byte{nil, {0xc1}, {0x81, 0xa1, 'o', 0x07}, bytes.Repeat([]byte{0xff}, 10000)} {
		rb, err := p.owner.HandleControl(context.Background(), fetcherNode, b)
		if err != nil {
			t.Fatalf("HandleControl(%x): %v", b, err)
		}
		rep, err := decodeReply(rb)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Code != wire.CodeProtocol {
			t.Errorf("HandleControl(%x): code %v, want wire.CodeProtocol", b, rep.Code)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []request{
		{Op: opChallenge},
		{Op: opProve, Challenge: 3, MAC: make([]byte, macLen)},
		{Op: opBegin, Incarnation: 1, ExportID: 2, Lease: 3, Acq: 4, Alloc: 5, Offset: 6, Bytes: 7, WantHandle: true},
		{Op: opEnd, Acq: 9},
		{Op: opRevoke, Incarnation: 1, Revoked: []uint64{4, 5}},
	} {
		b, _ := encode(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			return
		}
		if r.Op == opProve && len(r.MAC) != macLen {
			t.Fatalf("accepted a MAC of %d bytes", len(r.MAC))
		}
		if r.Op == opRevoke && (len(r.Revoked) == 0 || len(r.Revoked) > maxRevoked) {
			t.Fatalf("accepted a revoke of %d allocations", len(r.Revoked))
		}
	})
}

func FuzzDecodeReply(f *testing.F) {
	for _, r := range []reply{
		{Code: rdma.CodeOK, Handle: make([]byte, 64), MapSize: 1 << 21, Shift: 512, Base: 1 << 40, Device: 1, Process: make([]byte, processIDLen), Revoked: []uint64{1, 2}},
		{Code: rdma.CodeOK, Challenge: 5, Path: "/dev/shm/tensorferry-ipc-00"},
		{Code: wire.CodeNotFound, Msg: "no"},
		{Code: wire.ErrCode(1 << 31), Msg: "a code from a later version"},
	} {
		b, _ := encode(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeReply(b)
		if err != nil {
			return
		}
		if r.Shift > r.MapSize || len(r.Revoked) > maxRevoked || (len(r.Handle) != 0 && len(r.Handle) != 64) {
			t.Fatalf("accepted a bad reply: %+v", r)
		}
		_ = r.err("owner")
	})
}
