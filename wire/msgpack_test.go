package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestCheckMsgpackAccepts(t *testing.T) {
	values := []any{
		nil, true, false, 0, 1, -1, -33, 127, 128, 255, 256, 65535, 65536, 1 << 32, -1 << 40,
		float32(1.5), 2.25, "", "a", strings.Repeat("s", 40), strings.Repeat("s", 300), strings.Repeat("s", 70000),
		[]byte{}, []byte{1}, make([]byte, 300), make([]byte, 70000),
		[]any{}, []any{1, "a", []any{nil}}, make([]int, 20), make([]int, 70000),
		map[string]any{}, map[string]any{"a": 1, "b": map[string]any{"c": []any{}}},
		map[int]int{1: 2, 3: 4, 5: 6, 7: 8, 9: 10, 11: 12, 13: 14, 15: 16, 17: 18, 19: 20, 21: 22, 23: 24, 25: 26, 27: 28, 29: 30, 31: 32},
		msgpack.RawMessage{0xd4, 0x01, 0x02},             // fixext1
		msgpack.RawMessage{0xd8, 0x01, 17: 0x00},         // fixext16
		msgpack.RawMessage{0xc7, 0x02, 0x05, 0x01, 0x02}, // ext8
		&Message{Target: "t", Header: map[string]string{"a": "b"}, Body: []byte{1}},
	}
	for _, v := range values {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatalf("marshal %T: %v", v, err)
		}
		if err := checkMsgpack(b, MaxMsgpackDepth); err != nil {
			t.Errorf("%T %.40v: %v (% x)", v, v, err, b[:min(len(b), 16)])
		}
	}
}

func TestCheckMsgpackRejects(t *testing.T) {
	for _, tc := range hostileBodies {
		if tc.name == "wrong type" || tc.name == "not a map" || tc.name == "header map with int values" {
			continue // well-formed msgpack, wrong for the type: the decoder rejects it
		}
		b := unhex(t, tc.hex)
		err := checkMsgpack(b, MaxMsgpackDepth)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

func TestCheckMsgpackDepth(t *testing.T) {
	nested := unhex(t, strings.Repeat("91", 3)+"00")
	if err := checkMsgpack(nested, 3); err != nil {
		t.Fatalf("depth 3 at limit 3: %v", err)
	}
	if err := checkMsgpack(nested, 2); !errors.Is(err, errMsgpackDepth) {
		t.Fatalf("depth 3 at limit 2: %v", err)
	}
}

func TestDecodeMsgpackHostile(t *testing.T) {
	for _, tc := range hostileBodies {
		var m Message
		b := unhex(t, tc.hex)
		var err error
		n := allocatedBytes(func() { err = DecodeMsgpack(b, &m) })
		if !errors.Is(err, ErrBadBody) {
			t.Errorf("%s: got %v, want ErrBadBody", tc.name, err)
		}
		if n > 64<<10 {
			t.Errorf("%s: %d bytes allocated for %d bytes of input", tc.name, n, len(b))
		}
	}
}

func TestEncodeDecodeMsgpack(t *testing.T) {
	in := Message{Target: "a", Header: map[string]string{"z": "1", "a": "2", "m": "3"}, Body: []byte("x")}
	b1, err := EncodeMsgpack(&in)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 { // map keys are sorted: the encoding is deterministic
		b2, err := EncodeMsgpack(&in)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encodings differ: %x vs %x", b1, b2)
		}
	}
	var out Message
	if err := DecodeMsgpack(b1, &out); err != nil {
		t.Fatal(err)
	}
	if out.Target != "a" || out.Header["m"] != "3" || string(out.Body) != "x" {
		t.Fatalf("got %+v", out)
	}
	// Decoded bytes do not alias the input.
	b1[len(b1)-1] ^= 0xff
	if string(out.Body) != "x" && out.Header["m"] != "3" {
		t.Fatal("decoded value aliases the input")
	}
}

func TestUnknownFieldsIgnored(t *testing.T) {
	// {t:"a", zz:[1,2], r:5}: a newer peer's extra field is skipped.
	b := unhex(t, "83 a174 a161 a27a7a 920102 a172 05")
	var m Message
	if err := DecodeMsgpack(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Target != "a" || m.Request != 5 {
		t.Fatalf("got %+v", m)
	}
}
