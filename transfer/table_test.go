package transfer

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/vmihailenco/msgpack/v5"
)

func runtimeGosched() { runtime.Gosched() }

func TestTableRoundTrip(t *testing.T) {
	d := &tensor.Descriptor{Owner: "a", Incarnation: 3, ExportID: 4, Lease: 5, DType: tensor.Float32, Shape: tensor.Shape{2, 2}, Bytes: 16, Device: "cuda:0",
		Offers: map[string][]byte{"ipc": {1, 2}}}
	in := []entry{
		{ID: 1, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{3}, Data: []byte{7, 8, 9}},
		{ID: 2, Kind: entryFetch, Desc: d},
		{ID: 9, Kind: entryRef, Desc: d},
	}
	b, err := encodeTable(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeTable(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || out[0].ID != 1 || string(out[0].Data) != "\x07\x08\x09" || out[1].Desc.Lease != 5 || out[2].Kind != entryRef ||
		string(out[1].Desc.Offers["ipc"]) != "\x01\x02" {
		t.Fatalf("decoded %+v", out)
	}
}

// TestTableEncodingMatchesReflection: encodeTable writes the bytes
// msgpack's reflection writes for the entry struct with wire's settings
// (what tables were before they were encoded with msgp's primitives), so
// nodes of either kind read each other's tables.
func TestTableEncodingMatchesReflection(t *testing.T) {
	d := &tensor.Descriptor{Owner: "a", Incarnation: 1 << 40, ExportID: 4, Lease: 1<<64 - 1, DType: tensor.Float32, Shape: tensor.Shape{2, 300}, Bytes: 2400,
		Device: "cuda:0", Holder: "h", Offers: map[string][]byte{"ipc": make([]byte, 64)}}
	for _, entries := range [][]entry{
		nil,
		{{ID: 1, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{3}, Data: []byte{7, 8, 9}}},
		{{ID: 1 << 33, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{}, Data: []byte{}}},
		{{ID: 2, Kind: entryFetch, Desc: d}, {ID: 300, Kind: entryRef, Desc: &tensor.Descriptor{Owner: "b", Device: "cpu"}}},
		{{ID: 5, Kind: 9}},
	} {
		got, err := encodeTable(entries)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.UseCompactInts(true)
		enc.SetSortMapKeys(true)
		type reflective entry // no methods: msgpack's reflection
		refl := make([]reflective, len(entries))
		for i := range entries {
			refl[i] = reflective(entries[i])
		}
		if entries == nil {
			refl = []reflective{}
		}
		if err := enc.Encode(refl); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, buf.Bytes()) {
			t.Fatalf("%+v:\nencodeTable %x\nreflection  %x", entries, got, buf.Bytes())
		}
	}
}

func TestTableBadInput(t *testing.T) {
	d := &tensor.Descriptor{Owner: "a", DType: tensor.Float32, Shape: tensor.Shape{2}, Bytes: 8, Device: "cpu"}
	bad := *d
	bad.Bytes = 9
	for name, entries := range map[string][]entry{
		"inline size":          {{ID: 1, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{3}, Data: []byte{1}}},
		"unknown kind":         {{ID: 1, Kind: 9}},
		"fetch without desc":   {{ID: 1, Kind: entryFetch}},
		"bad descriptor":       {{ID: 1, Kind: entryFetch, Desc: &bad}},
		"duplicate id":         {{ID: 1, Kind: entryFetch, Desc: d}, {ID: 1, Kind: entryRef, Desc: d}},
		"inline and described": {{ID: 1, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{1}, Data: []byte{1}, Desc: d}},
	} {
		b, err := encodeTable(entries)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeTable(b); !errors.Is(err, ErrBadTable) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"not an array":      {0x81, 0xa1, 'i', 0x01},
		"count beyond":      {0xdd, 0x00, 0x10, 0x00, 0x00, 0x80},
		"too many":          append([]byte{0xdd, 0x00, 0x00, 0x04, 0x01}, make([]byte, 1025)...),
		"truncated":         {0x91, 0x82, 0xa1, 'i'},
		"trailing bytes":    {0x90, 0x90},
		"entry not a map":   {0x91, 0x01},
		"shape of 2^40 dim": {0x91, 0x84, 0xa1, 'i', 0x01, 0xa1, 'k', 0x01, 0xa1, 's', 0x91, 0xcf, 0, 0, 1, 0, 0, 0, 0, 0, 0xa1, 't', 0x01},
	} {
		if _, err := decodeTable(b); !errors.Is(err, ErrBadTable) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzTableDecode: the tensor-table decoder never panics, allocates in
// proportion to its input, and what it accepts re-encodes to a table that
// decodes the same.
func FuzzTableDecode(f *testing.F) {
	d := &tensor.Descriptor{Owner: "a", DType: tensor.Float32, Shape: tensor.Shape{2}, Bytes: 8, Device: "cpu"}
	for _, entries := range [][]entry{
		{{ID: 1, Kind: entryInline, DType: tensor.Uint8, Shape: tensor.Shape{3}, Data: []byte{7, 8, 9}}},
		{{ID: 2, Kind: entryFetch, Desc: d}, {ID: 3, Kind: entryRef, Desc: d}},
	} {
		b, _ := encodeTable(entries)
		f.Add(b)
	}
	f.Add([]byte{0xdd, 0x00, 0x10, 0x00, 0x00, 0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		var out []entry
		var err error
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		out, err = decodeTable(in)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > uint64(64<<10+64*len(in)) {
			t.Fatalf("%d bytes allocated for %d bytes of input", n, len(in))
		}
		if err != nil {
			return
		}
		b, err := encodeTable(out)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeTable(b)
		if err != nil || len(again) != len(out) {
			t.Fatalf("re-encoded table: %v, %d entries vs %d", err, len(again), len(out))
		}
	})
}

// FuzzAdvertDecode: a peer's advert (capabilities and window) never makes
// the decoder panic or allocate beyond its input's proportion, and what it
// accepts names the peer it came from.
func FuzzAdvertDecode(f *testing.F) {
	e := New(Config{Node: "a", Incarnation: 7})
	defer e.Close()
	if err := e.Start(); err != nil {
		f.Fatal(err)
	}
	b, err := e.Advert()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'c', 0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		a, err := decodeAdvert(in, "a", 7)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > uint64(64<<10+64*len(in)) {
			t.Fatalf("%d bytes allocated for %d bytes of input", n, len(in))
		}
		if err == nil && (a.Caps.Node != "a" || a.Caps.Incarnation != 7 || a.WindowMsgs < 0) {
			t.Fatalf("accepted %+v", a)
		}
	})
}
