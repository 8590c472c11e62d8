package tensor

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/vmihailenco/msgpack/v5"
)

type fieldMsg struct {
	Step int
	W    *Tensor
	R    Ref
	Opt  *Tensor
	Many []*Tensor
}

// TestFieldsEncodeAsTableReferences: a message body holds [kind, WireID]
// for each tensor and Ref field and no tensor bytes; decoding yields
// placeholders naming the same ids, which Fill and FillRef complete.
func TestFieldsEncodeAsTableReferences(t *testing.T) {
	w, _ := FromFloat32s([]float32{1, 2, 3, 4}, Shape{4})
	x, _ := FromFloat32s([]float32{5}, Shape{1})
	local, _ := FromFloat32s([]float32{6}, Shape{1})
	in := fieldMsg{Step: 7, W: w, R: NewRef(local), Many: []*Tensor{x}}
	b, err := msgpack.Marshal(&in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, w.Host()) {
		t.Fatalf("body %x holds the tensor's bytes", b)
	}
	var out fieldMsg
	if err := msgpack.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Step != 7 || out.Opt != nil {
		t.Fatalf("decoded %+v", out)
	}
	for _, c := range []struct {
		got  *Tensor
		want uint64
	}{{out.W, w.WireID()}, {out.Many[0], x.WireID()}} {
		if id, ok := Placeholder(c.got); !ok || id != c.want {
			t.Fatalf("placeholder id %d %v, want %d", id, ok, c.want)
		}
	}
	if id, ok := RefPlaceholder(out.R); !ok || id != in.R.WireID() {
		t.Fatalf("ref placeholder id %d %v, want %d", id, ok, in.R.WireID())
	}
	if _, ok := Placeholder(w); ok {
		t.Fatal("a tensor made by FromFloat32s is a placeholder")
	}
	src, _ := FromFloat32s([]float32{9, 8, 7, 6}, Shape{4})
	if err := Fill(out.W, src); err != nil {
		t.Fatal(err)
	}
	if got := out.W.Float32s(); len(got) != 4 || got[0] != 9 || out.W.WireID() == w.WireID() {
		t.Fatalf("filled tensor %v %v id %d", out.W, got, out.W.WireID())
	}
	if err := Fill(out.W, src); !errors.Is(err, ErrNotPlaceholder) {
		t.Fatalf("second Fill: %v", err)
	}
	d := &Descriptor{Owner: "a", DType: Float32, Shape: Shape{1}, Bytes: 4, Device: "cpu"}
	if err := FillRef(out.R, d, nil); err != nil {
		t.Fatal(err)
	}
	if out.R.Descriptor() != d {
		t.Fatal("FillRef did not set the descriptor")
	}
	if err := FillRef(out.R, d, nil); !errors.Is(err, ErrNotPlaceholder) {
		t.Fatalf("second FillRef: %v", err)
	}
	if err := FillRef(Ref{}, d, nil); !errors.Is(err, ErrNotPlaceholder) {
		t.Fatalf("FillRef of the empty Ref: %v", err)
	}
}

func TestFieldBadEncodings(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"tensor as ref kind", []byte{0x81, 0xa1, 'W', 0x92, 0x03, 0x01}},
		{"ref as tensor kind", []byte{0x81, 0xa1, 'R', 0x92, 0x01, 0x01}},
		{"three elements", []byte{0x81, 0xa1, 'W', 0x93, 0x01, 0x01, 0x01}},
		{"not an array", []byte{0x81, 0xa1, 'W', 0x01}},
		{"truncated", []byte{0x81, 0xa1, 'W', 0x92, 0x01}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out fieldMsg
			if err := msgpack.Unmarshal(tc.in, &out); err == nil {
				t.Fatalf("decoded %x without error: %+v", tc.in, out)
			}
		})
	}
}

func TestUnfilledRefFetchFails(t *testing.T) {
	var r Ref
	if err := msgpack.Unmarshal([]byte{0x92, 0x03, 0x05}, &r); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Fetch(t.Context(), memory.CPU); err == nil {
		t.Fatal("fetch of an unfilled Ref succeeded")
	}
	if r.String() != "Ref(unfilled placeholder)" {
		t.Fatal(r.String())
	}
}

// FuzzFieldDecode: decoding tensor and Ref fields never panics; whatever
// decodes is a placeholder or empty.
func FuzzFieldDecode(f *testing.F) {
	w, _ := FromFloat32s([]float32{1}, Shape{1})
	b, _ := msgpack.Marshal(&fieldMsg{W: w, R: NewRef(w), Many: []*Tensor{w, nil}})
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'W', 0x92, 0x01, 0xcf, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 4096 {
			return
		}
		var out fieldMsg
		if err := msgpack.Unmarshal(in, &out); err != nil {
			return
		}
		if out.W != nil {
			if _, ok := Placeholder(out.W); !ok {
				t.Fatal("decoded tensor is not a placeholder")
			}
		}
		_ = out.R.String()
	})
}

// compactMarshal encodes v as wire's reflective encoder does (compact
// integers).
func compactMarshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	err := enc.Encode(v)
	return buf.Bytes(), err
}

// TestFieldsMsgpMatchesMsgpack: the msgp methods (for generated message
// codecs) write the bytes EncodeMsgpack writes and read them back the same.
func TestFieldsMsgpMatchesMsgpack(t *testing.T) {
	w, _ := FromFloat32s([]float32{1}, Shape{1})
	for _, v := range []interface {
		MarshalMsg([]byte) ([]byte, error)
	}{w, NewRef(w), Ref{}} {
		want, err := compactMarshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := v.MarshalMsg([]byte{0xee})
		if err != nil || got[0] != 0xee || !bytes.Equal(got[1:], want) {
			t.Fatalf("%T: MarshalMsg %x (%v), msgpack %x", v, got, err, want)
		}
	}
	var wt Tensor
	b, _ := w.MarshalMsg(nil)
	if rest, err := wt.UnmarshalMsg(append(b, 0x01)); err != nil || len(rest) != 1 {
		t.Fatalf("UnmarshalMsg: rest %x, %v", rest, err)
	}
	if id, ok := Placeholder(&wt); !ok || id != w.WireID() {
		t.Fatalf("placeholder %d %v", id, ok)
	}
	var r Ref
	b, _ = NewRef(w).MarshalMsg(nil)
	if _, err := r.UnmarshalMsg(b); err != nil {
		t.Fatal(err)
	}
	if _, ok := RefPlaceholder(r); !ok {
		t.Fatal("decoded Ref is not a placeholder")
	}
	if _, err := r.UnmarshalMsg([]byte{0xc0}); err != nil || r.WireID() != 0 {
		t.Fatalf("nil Ref: %v, id %d", err, r.WireID())
	}
	for _, bad := range [][]byte{{}, {0x92, 0x03, 0x01}, {0x93, 0x01, 0x01, 0x01}, {0x01}, {0x92, 0x01}, {0x92, 0x01, 0xcf, 1}} {
		var x Tensor
		if _, err := x.UnmarshalMsg(bad); err == nil {
			t.Errorf("tensor field %x decoded", bad)
		}
	}
}

// FuzzFieldUnmarshalMsg: the msgp decoders of tensor and Ref fields never
// panic, agree with DecodeMsgpack on what they accept, and consume only
// their field.
func FuzzFieldUnmarshalMsg(f *testing.F) {
	w, _ := FromFloat32s([]float32{1}, Shape{1})
	b, _ := w.MarshalMsg(nil)
	f.Add(b)
	b, _ = NewRef(w).MarshalMsg(nil)
	f.Add(b)
	f.Add([]byte{0xc0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var x, y Tensor
		rest, err := x.UnmarshalMsg(in)
		if err == nil {
			if len(rest) > len(in) {
				t.Fatal("rest longer than input")
			}
			if err := msgpack.Unmarshal(in[:len(in)-len(rest)], &y); err != nil || y.id != x.id {
				t.Fatalf("msgp accepted %x, msgpack: %v", in, err)
			}
		}
		var r Ref
		if _, err := r.UnmarshalMsg(in); err == nil {
			_ = r.String()
		}
	})
}
