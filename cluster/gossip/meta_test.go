package gossip

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/tinylib/msgp/msgp"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []nodeMeta{
		{Incarnation: 0, Address: "h:1", DataAddress: "h:2"},
		{Incarnation: 1<<64 - 1, Address: "[::1]:7001", DataAddress: "node.example:7101", Leaving: true},
	} {
		b := appendMeta(nil, m)
		got, err := decodeMeta(b)
		if err != nil || got != m {
			t.Errorf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	// The exact bytes of version 1: [1, 5, "a:1", "b:2", 1].
	want := []byte{0x95, 0x01, 0x05, 0xa3, 'a', ':', '1', 0xa3, 'b', ':', '2', 0x01}
	if b := appendMeta(nil, nodeMeta{Incarnation: 5, Address: "a:1", DataAddress: "b:2", Leaving: true}); !bytes.Equal(b, want) {
		t.Errorf("meta % x, want % x", b, want)
	}
}

// metaOf builds a meta array of arbitrary elements.
func metaOf(n uint32, elems ...func([]byte) []byte) []byte {
	b := msgp.AppendArrayHeader(nil, n)
	for _, e := range elems {
		b = e(b)
	}
	return b
}

func u(v uint64) func([]byte) []byte { return func(b []byte) []byte { return msgp.AppendUint64(b, v) } }
func s(v string) func([]byte) []byte { return func(b []byte) []byte { return msgp.AppendString(b, v) } }

func TestDecodeMetaRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "empty"},
		{"too long", bytes.Repeat([]byte{0xc0}, memberlist.MetaMaxSize+1), "more than 512"},
		{"not an array", []byte{0x01}, "bad node meta"},
		{"three fields", metaOf(3, u(1), u(1), s("a:1")), "3 fields"},
		{"too many fields", metaOf(17), "17 fields"},
		{"other version", metaOf(4, u(2), u(1), s("a:1"), s("b:2")), "version 2"},
		{"version not a number", metaOf(4, s("1"), u(1), s("a:1"), s("b:2")), "version"},
		{"incarnation negative", metaOf(4, u(1), func(b []byte) []byte { return msgp.AppendInt64(b, -1) }, s("a:1"), s("b:2")), "incarnation"},
		{"address not a string", metaOf(4, u(1), u(1), u(3), s("b:2")), "address"},
		{"bad address", metaOf(4, u(1), u(1), s("a"), s("b:2")), "address"},
		{"address with a newline", metaOf(4, u(1), u(1), s("a\n:1"), s("b:2")), "control character"},
		{"bad data address", metaOf(4, u(1), u(1), s("a:1"), s("b:99999")), "data address"},
		{"short string", metaOf(4, u(1), u(1), s("a:1"))[:6], "address"},
		{"string longer than the bytes", append(metaOf(4, u(1), u(1)), 0xdb, 0x7f, 0xff, 0xff, 0xff), "address"},
		{"flags not a byte", metaOf(5, u(1), u(1), s("a:1"), s("b:2"), u(300)), "flags"},
		{"truncated extra field", append(metaOf(6, u(1), u(1), s("a:1"), s("b:2"), u(0)), 0xa5, 'x'), "field 5"},
		{"trailing bytes", append(metaOf(4, u(1), u(1), s("a:1"), s("b:2")), 0), "1 bytes after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decodeMeta(tc.b)
			if err == nil || !errors.Is(err, errMeta) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeMeta = %+v, %v; want an error with %q", m, err, tc.want)
			}
		})
	}
	// A later version's extra fields are skipped; four fields mean no flags.
	m, err := decodeMeta(metaOf(7, u(1), u(9), s("a:1"), s("b:2"), u(1), s("future"), u(7)))
	if err != nil || m != (nodeMeta{Incarnation: 9, Address: "a:1", DataAddress: "b:2", Leaving: true}) {
		t.Errorf("with extra fields: %+v, %v", m, err)
	}
	m, err = decodeMeta(metaOf(4, u(1), u(9), s("a:1"), s("b:2")))
	if err != nil || m.Leaving {
		t.Errorf("four fields: %+v, %v", m, err)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(appendMeta(nil, nodeMeta{Incarnation: 5, Address: "a:1", DataAddress: "b:2", Leaving: true}))
	f.Add(appendMeta(nil, nodeMeta{Incarnation: 1 << 40, Address: "[::1]:7001", DataAddress: "host.example:65535"}))
	f.Add(metaOf(7, u(1), u(9), s("a:1"), s("b:2"), u(1), s("future"), u(7)))
	f.Add(metaOf(4, u(1), u(1), s("a:1"))[:6])
	f.Add([]byte{0x95})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, errMeta) {
				t.Fatalf("error %v does not wrap errMeta", err)
			}
			return
		}
		if len(b) > memberlist.MetaMaxSize {
			t.Fatalf("accepted %d bytes", len(b))
		}
		// What decodes re-encodes to a meta that decodes the same.
		back, err := decodeMeta(appendMeta(nil, m))
		if err != nil || back != m {
			t.Fatalf("round trip of %+v: %+v, %v", m, back, err)
		}
	})
}
