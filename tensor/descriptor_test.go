package tensor

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func validDescriptor() *Descriptor {
	return &Descriptor{
		Owner: "a", Incarnation: 7, ExportID: 3, Lease: 99,
		DType: Float32, Shape: Shape{2, 3}, Bytes: 24, Device: "cuda:1",
		Offers: map[string][]byte{"ipc": {1, 2, 3}},
	}
}

func TestDescriptorValidate(t *testing.T) {
	mod := func(f func(d *Descriptor)) *Descriptor { d := validDescriptor(); f(d); return d }
	manyOffers := map[string][]byte{}
	for i := range maxOffers + 1 {
		manyOffers[string(rune('a'+i))] = nil
	}
	tests := []struct {
		name string
		d    *Descriptor
		want error // nil: valid
	}{
		{"valid", validDescriptor(), nil},
		{"no offers", mod(func(d *Descriptor) { d.Offers = nil }), nil},
		{"cpu", mod(func(d *Descriptor) { d.Device = "cpu" }), nil},
		{"empty tensor", mod(func(d *Descriptor) { d.Shape, d.Bytes = Shape{0, 5}, 0 }), nil},
		{"nil", nil, ErrBadDescriptor},
		{"no owner", mod(func(d *Descriptor) { d.Owner = "" }), ErrBadDescriptor},
		{"long owner", mod(func(d *Descriptor) { d.Owner = strings.Repeat("x", maxNameLen+1) }), ErrBadDescriptor},
		{"size too small", mod(func(d *Descriptor) { d.Bytes = 23 }), ErrBadSize},
		{"size too large", mod(func(d *Descriptor) { d.Bytes = 25 }), ErrBadSize},
		{"negative size", mod(func(d *Descriptor) { d.Bytes = -24 }), ErrBadSize},
		{"overflowing dims", mod(func(d *Descriptor) { d.Shape = Shape{1 << 40, 1 << 40} }), ErrOverflow},
		{"overflowing bytes", mod(func(d *Descriptor) { d.Shape = Shape{1 << 62} }), ErrOverflow},
		{"negative dim", mod(func(d *Descriptor) { d.Shape = Shape{-2, -12} }), ErrBadShape},
		{"too many dims", mod(func(d *Descriptor) { d.Shape = make(Shape, MaxDims+1) }), ErrBadShape},
		{"unknown dtype", mod(func(d *Descriptor) { d.DType = 77 }), ErrBadDType},
		{"invalid dtype", mod(func(d *Descriptor) { d.DType = Invalid }), ErrBadDType},
		{"bad device", mod(func(d *Descriptor) { d.Device = "tpu:0" }), ErrBadDescriptor},
		{"bad device ordinal", mod(func(d *Descriptor) { d.Device = "cuda:-1" }), ErrBadDescriptor},
		{"no device", mod(func(d *Descriptor) { d.Device = "" }), ErrBadDescriptor},
		{"too many offers", mod(func(d *Descriptor) { d.Offers = manyOffers }), ErrBadDescriptor},
		{"offer too large", mod(func(d *Descriptor) { d.Offers = map[string][]byte{"ipc": make([]byte, maxOfferBytes+1)} }), ErrBadDescriptor},
		{"offer name too long", mod(func(d *Descriptor) { d.Offers = map[string][]byte{strings.Repeat("n", maxNameLen+1): nil} }), ErrBadDescriptor},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.d.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrBadDescriptor) {
				t.Fatalf("Validate: %v, want %v (and ErrBadDescriptor)", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "tensor: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestDescriptorMsgpack(t *testing.T) {
	d := validDescriptor()
	b, err := msgpack.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var got Descriptor
	if err := msgpack.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.String() != d.String() || string(got.Offers["ipc"]) != string(d.Offers["ipc"]) || len(got.Offers) != 1 {
		t.Fatalf("round trip: %v %v", &got, got.Offers)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	// Unknown fields are skipped; a nil descriptor map decodes empty.
	b, _ = msgpack.Marshal(map[string]any{"o": "x", "zz": []int{1, 2}, "b": 0, "t": 1, "d": "cpu", "s": []int64{0}})
	if err := msgpack.Unmarshal(b, &got); err != nil || got.Owner != "x" || got.Validate() != nil {
		t.Fatalf("with an unknown field: %+v %v", got, err)
	}
}

func TestDescriptorDecodeRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"map32 of 2^32-1 fields", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}},
		{"offers map32 of 2^32-1", []byte{0x81, 0xa1, 'f', 0xdf, 0xff, 0xff, 0xff, 0xff}},
		{"9 offers", append([]byte{0x81, 0xa1, 'f', 0x89}, make([]byte, 18)...)},
		{"shape of 2^32-1 dims", []byte{0x81, 0xa1, 's', 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"truncated", []byte{0x82, 0xa1, 'o', 0xa1, 'x'}},
		{"owner not a string", []byte{0x81, 0xa1, 'o', 0x01}},
		{"not a map", []byte{0x91, 0x01}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var d, e Descriptor
			err := msgpack.Unmarshal(tc.in, &d)
			_, errMsgp := e.UnmarshalMsg(tc.in)
			runtime.ReadMemStats(&after)
			if err == nil || errMsgp == nil {
				t.Fatalf("decoded %v (%v), %v (%v)", &d, err, &e, errMsgp)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
				t.Errorf("decoding %d bytes allocated %d bytes", len(tc.in), grew)
			}
		})
	}
}

// TestDescriptorMarshalMsg: MarshalMsg writes the bytes msgpack's
// reflection writes with wire's settings (compact integers, sorted map
// keys), and UnmarshalMsg reads them back.
func TestDescriptorMarshalMsg(t *testing.T) {
	neg := validDescriptor()
	neg.Bytes, neg.Shape, neg.Holder = -300, nil, "h"
	neg.Offers = map[string][]byte{"m": make([]byte, 300)}
	many := validDescriptor()
	// One key per map: msgpack's reflection does not sort the keys of a
	// map[string][]byte (MarshalMsg does).
	many.Offers = map[string][]byte{"z": nil}
	many.Incarnation, many.Lease, many.Content, many.Relay = 1<<63, 1<<32, 1<<40, "r1"
	for _, d := range []*Descriptor{validDescriptor(), neg, many, {}} {
		var buf strings.Builder
		enc := msgpack.NewEncoder(&buf)
		enc.UseCompactInts(true)
		enc.SetSortMapKeys(true)
		if err := enc.Encode(d); err != nil {
			t.Fatal(err)
		}
		got, err := d.MarshalMsg([]byte{0xee})
		if err != nil || got[0] != 0xee || string(got[1:]) != buf.String() {
			t.Fatalf("%+v:\nMarshalMsg %x\nmsgpack    %x", d, got[1:], buf.String())
		}
		if n := d.Msgsize(); n < len(got)-1 {
			t.Fatalf("Msgsize %d < %d bytes", n, len(got)-1)
		}
		var back Descriptor
		if rest, err := back.UnmarshalMsg(got[1:]); err != nil || len(rest) != 0 || back.String() != d.String() || back.Holder != d.Holder || back.Content != d.Content || back.Relay != d.Relay || len(back.Offers) != len(d.Offers) {
			t.Fatalf("UnmarshalMsg: %+v, rest %x, %v", back, rest, err)
		}
	}
}

// FuzzDescriptorUnmarshalMsg: the descriptor decoder never panics, and
// what it accepts re-encodes to bytes that decode to the same descriptor.
func FuzzDescriptorUnmarshalMsg(f *testing.F) {
	b, _ := validDescriptor().MarshalMsg(nil)
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'f', 0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		var d Descriptor
		if _, err := d.UnmarshalMsg(in); err != nil {
			return
		}
		b, _ := d.MarshalMsg(nil)
		var again Descriptor
		if rest, err := again.UnmarshalMsg(b); err != nil || len(rest) != 0 || again.String() != d.String() || again.Content != d.Content || again.Relay != d.Relay {
			t.Fatalf("re-encoded %x: %v", b, err)
		}
	})
}
