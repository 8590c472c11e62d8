package wire

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

type testGrad struct {
	Step  int64
	Name  string
	Value []float32
}

type testOther struct{ X int }

func TestRegistryMsgpackRoundTrip(t *testing.T) {
	r := NewRegistry()
	if err := r.Register("test.Grad", testGrad{}); err != nil {
		t.Fatal(err)
	}
	in := &testGrad{Step: 3, Name: "w", Value: []float32{1, 2.5}}
	name, ser, body, err := r.AppendEncode(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	if name != "test.Grad" || ser != SerMsgpack {
		t.Fatalf("Encode: %q %d", name, ser)
	}
	// A value (not a pointer) encodes the same way.
	_, _, body2, err := r.AppendEncode(nil, *in)
	if err != nil || string(body2) != string(body) {
		t.Fatalf("value encoding: %v", err)
	}
	out, err := r.Decode(name, ser, body)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("Decode: %#v", out)
	}
	if rt, ok := r.Type("test.Grad"); !ok || rt.Type() != reflect.TypeFor[testGrad]() || rt.Name() != "test.Grad" {
		t.Fatalf("Type: %v %v", rt, ok)
	}
}

func TestRegistryProtobuf(t *testing.T) {
	r := NewRegistry()
	if err := r.Register("google.protobuf.StringValue", &wrapperspb.StringValue{}); err != nil {
		t.Fatal(err)
	}
	name, ser, body, err := r.AppendEncode(nil, wrapperspb.String("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if ser != SerProtobuf {
		t.Fatalf("serializer %d, want protobuf", ser)
	}
	out, err := r.Decode(name, ser, body)
	if err != nil {
		t.Fatal(err)
	}
	if sv, ok := out.(*wrapperspb.StringValue); !ok || sv.GetValue() != "hello" {
		t.Fatalf("Decode: %#v", out)
	}
	if _, err := r.Decode(name, ser, []byte{0x0a, 0xff}); err == nil {
		t.Fatal("truncated protobuf accepted")
	}
}

func TestRegistryErrors(t *testing.T) {
	r := NewRegistry()
	r.MustRegister("a", testGrad{})
	if err := r.Register("a", &testGrad{}); err != nil {
		t.Fatalf("registering the same name and type again: %v", err)
	}
	if err := r.Register("a", testOther{}); err == nil {
		t.Fatal("name reused for another type")
	}
	if err := r.Register("b", testGrad{}); err == nil {
		t.Fatal("type registered under a second name")
	}
	if err := r.Register("", testOther{}); err == nil {
		t.Fatal("empty name accepted")
	}
	if _, _, _, err := r.AppendEncode(nil, testOther{}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("Encode of unregistered type: %v", err)
	}
	if _, _, _, err := r.AppendEncode(nil, nil); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("Encode(nil): %v", err)
	}
	if _, _, _, err := r.AppendEncode(nil, (*testGrad)(nil)); err == nil {
		t.Fatal("Encode of a nil pointer accepted")
	}
	if _, err := r.Decode("nope", SerMsgpack, []byte{0x80}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("Decode of unknown name: %v", err)
	}
	if _, err := r.Decode("a", SerProtobuf, []byte{}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("Decode with the wrong serializer: %v", err)
	}
	for _, hb := range hostileBodies {
		switch hb.name {
		case "wrong type", "not a map", "header map with int values":
			continue // well-formed msgpack; whether it fits depends on the type
		}
		if _, err := r.Decode("a", SerMsgpack, unhex(t, hb.hex)); !errors.Is(err, ErrBadBody) {
			t.Errorf("hostile body %q accepted", hb.name)
		}
	}
	// Huge declared lengths are rejected before msgpack allocates.
	if _, err := r.Decode("a", SerMsgpack, unhex(t, "81 a556616c7565 ddffffffff")); !errors.Is(err, ErrBadBody) {
		t.Fatalf("huge array: %v", err)
	}
}

func TestRegistryConcurrent(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Register(fmt.Sprintf("other%d", i), testOther{}) // one name wins
			r.Register("grad", testGrad{})
			for j := range 100 {
				name, ser, body, err := r.AppendEncode(nil, &testGrad{Step: int64(j)})
				if err != nil {
					t.Error(err)
					return
				}
				v, err := r.Decode(name, ser, body)
				if err != nil || v.(*testGrad).Step != int64(j) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func FuzzRegistryDecode(f *testing.F) {
	r := NewRegistry()
	r.MustRegister("grad", testGrad{})
	r.MustRegister("msg", Message{})
	r.MustRegister("sv", &wrapperspb.StringValue{})
	_, _, body, _ := r.AppendEncode(nil, &testGrad{Step: 1, Name: "x", Value: []float32{1}})
	f.Add("grad", SerMsgpack, body)
	f.Add("sv", SerProtobuf, []byte{0x0a, 0x01, 'a'})
	for _, hb := range hostileBodies {
		f.Add("msg", SerMsgpack, unhex(f, hb.hex))
	}
	f.Fuzz(func(t *testing.T, name string, ser uint8, body []byte) {
		r.Decode(name, ser, body) // must not panic
	})
}
