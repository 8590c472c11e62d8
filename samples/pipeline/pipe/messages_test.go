package pipe

import (
	"testing"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/tinylib/msgp/msgp"
	"github.com/vmihailenco/msgpack/v5"
)

// TestMessagesCodecsInterchange: the generated codecs write tensor and Ref
// fields as the table references reflection writes, and each side reads
// the other's bodies into placeholders naming the same tensors.
func TestMessagesCodecsInterchange(t *testing.T) {
	x, _ := tensor.FromFloat32s([]float32{1, 2}, tensor.Shape{2})
	in := &Act1{Batch: 3, A: x, Skip: tensor.NewRef(x)}
	gen, err := in.MarshalMsg(nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := msgpack.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var viaRef, viaGen Act1
	if err := msgpack.Unmarshal(gen, &viaRef); err != nil {
		t.Fatalf("vmihailenco cannot read the generated encoding: %v", err)
	}
	if rest, err := viaGen.UnmarshalMsg(ref); err != nil || len(rest) != 0 {
		t.Fatalf("the generated decoder cannot read vmihailenco's encoding: %v", err)
	}
	for _, out := range []*Act1{&viaRef, &viaGen} {
		id, ok := tensor.Placeholder(out.A)
		rid, rok := tensor.RefPlaceholder(out.Skip)
		if out.Batch != 3 || !ok || id != x.WireID() || !rok || rid != in.Skip.WireID() {
			t.Fatalf("decoded %+v", out)
		}
	}
	var empty Act2
	b, _ := (&Act2{Batch: 1}).MarshalMsg(nil)
	if _, err := empty.UnmarshalMsg(b); err != nil || empty.A.WireID() != 0 {
		t.Fatalf("empty Refs: %+v, %v", empty, err)
	}
}

// FuzzMessagesDecode: the generated decoders, behind the validation the
// registry applies first (wire.CheckMsgpack), never panic on any input.
func FuzzMessagesDecode(f *testing.F) {
	x, _ := tensor.FromFloat32s([]float32{1}, tensor.Shape{1})
	b, _ := (&Act1{Batch: 1, A: x, Skip: tensor.NewRef(x)}).MarshalMsg(nil)
	f.Add(b)
	b, _ = (&Output{Batch: 2, Err: "e"}).MarshalMsg(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		if wire.CheckMsgpack(in) != nil {
			return
		}
		for _, m := range []msgp.Unmarshaler{&Input{}, &Act1{}, &Act2{}, &Output{}} {
			_, _ = m.UnmarshalMsg(in)
		}
	})
}
