package verbs

import (
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

func TestOfferRoundTrip(t *testing.T) {
	o := offer{Addr: 0x7f0012345000, Len: 1 << 30, RKey: 0xabcdef}
	b := o.encode()
	if len(b) != offerLen {
		t.Fatalf("encoded %d bytes", len(b))
	}
	got, err := decodeOffer(b)
	if err != nil || got != o {
		t.Fatalf("decodeOffer = %+v, %v; want %+v", got, err, o)
	}
	for _, bad := range [][]byte{nil, b[:offerLen-1], append(append([]byte{}, b...), 0), append([]byte{2}, b[1:]...)} {
		if _, err := decodeOffer(bad); !errors.Is(err, errBadMessage) {
			t.Errorf("decodeOffer(%x) = %v, want errBadMessage", bad, err)
		}
	}
	neg := o
	neg.Len = -1
	if _, err := decodeOffer(neg.encode()); err == nil {
		t.Error("negative length accepted")
	}
}

func TestRequestRoundTrip(t *testing.T) {
	var gid ibverbs.GID
	gid[10], gid[11], gid[12], gid[15] = 0xff, 0xff, 10, 1
	ep := ibverbs.Endpoint{QPN: 17, PSN: 0x123456, GID: gid, HasGID: true, MTU: ibverbs.MTU1024}
	for _, r := range []request{
		{Op: opConnect, Endpoint: endpointToMsg(ep), Rail: 1},
		{Op: opBegin, Incarnation: 3, ExportID: 9, Lease: 0xdeadbeef, Rail: 3},
		{Op: opEnd, Token: 4},
	} {
		b, err := encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", r, err)
		}
		if got.Op != r.Op || got.Token != r.Token || got.Lease != r.Lease || got.ExportID != r.ExportID || got.Rail != r.Rail {
			t.Fatalf("round trip %+v -> %+v", r, got)
		}
		if r.Op == opConnect {
			e, err := got.Endpoint.endpoint()
			if err != nil || e != ep {
				t.Fatalf("endpoint %+v, %v; want %+v", e, err, ep)
			}
		}
	}
}

func TestRequestRejects(t *testing.T) {
	enc := func(r request) []byte {
		b, err := encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := map[string][]byte{
		"empty":      nil,
		"garbage":    {0xc1, 0x00},
		"unknown op": enc(request{Op: 77}),
		"short gid":  enc(request{Op: opConnect, Endpoint: endpointMsg{QPN: 1, MTU: 3, GID: []byte{1, 2}}}),
		"bad mtu":    enc(request{Op: opConnect, Endpoint: endpointMsg{QPN: 1, MTU: 9}}),
		"qpn 0":      enc(request{Op: opConnect, Endpoint: endpointMsg{MTU: 3}}),
		"oversized":  make([]byte, maxControlBytes+1),
	}
	for name, b := range cases {
		if _, err := decodeRequest(b); !errors.Is(err, errBadMessage) {
			t.Errorf("%s: decodeRequest = %v, want errBadMessage", name, err)
		}
	}
}

func TestReplyErrorsKeepSentinels(t *testing.T) {
	for _, s := range []error{tensor.ErrUnknownExport, tensor.ErrBadLease, tensor.ErrStale, tensor.ErrStoreClosed} {
		r := reply{Code: codes.Code(s), Msg: s.Error()}
		b, err := encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeReply(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := got.err("owner"); !errors.Is(err, s) {
			t.Errorf("reply for %v gives %v", s, err)
		}
	}
	if err := (&reply{Code: codes.Code(rdma.ErrClosed)}).err("o"); !errors.Is(err, rdma.ErrPeerDown) {
		t.Errorf("closed owner gives %v, want ErrPeerDown", err)
	}
	if code := codes.Code(errors.New("boom")); code != wire.CodeInternal {
		t.Errorf("other error: code %v, want wire.CodeInternal", code)
	}
	if err := (&reply{Code: wire.CodeInternal, Msg: "boom"}).err("o"); err == nil || err.Error() != "verbs: owner o: boom" {
		t.Errorf("failure gives %v", err)
	}
	if err := (&reply{}).err("o"); err != nil {
		t.Errorf("OK gives %v", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []request{
		{Op: opConnect, Endpoint: endpointMsg{QPN: 5, PSN: 7, MTU: 3, GID: make([]byte, 16)}},
		{Op: opBegin, Incarnation: 1, ExportID: 2, Lease: 3},
		{Op: opEnd, Token: 1},
	} {
		b, _ := encode(&r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			return
		}
		if r.Op != opConnect && r.Op != opBegin && r.Op != opEnd {
			t.Fatalf("accepted op %d", r.Op)
		}
		if r.Op == opConnect {
			if _, err := r.Endpoint.endpoint(); err != nil {
				t.Fatalf("accepted a bad endpoint: %v", err)
			}
		}
	})
}

func FuzzDecodeReply(f *testing.F) {
	for _, r := range []reply{
		{Code: rdma.CodeOK, Token: 3, Addr: 0x1000, RKey: 5, Len: 4096},
		{Code: wire.CodeReleased, Msg: "no"},
		{Endpoint: endpointMsg{QPN: 1, MTU: 3}},
	} {
		b, _ := encode(&r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeReply(b)
		if err != nil {
			return
		}
		if r.Len < 0 {
			t.Fatal("negative length accepted")
		}
		_ = r.err("o")
		_, _ = r.Endpoint.endpoint()
	})
}

func FuzzDecodeOffer(f *testing.F) {
	f.Add(offer{Addr: 1, Len: 2, RKey: 3}.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decodeOffer(b)
		if err != nil {
			return
		}
		if o.Len < 0 {
			t.Fatal("negative length accepted")
		}
		if got, _ := decodeOffer(o.encode()); got != o {
			t.Fatalf("re-encode %+v -> %+v", o, got)
		}
	})
}
