package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// The tests below hold msgp's generated codecs (gencodec_gen_test.go) to
// vmihailenco's reflection, the default of MsgpackSerializer: a body
// written by either decodes with either to the value that was encoded.

// gcTypes are the generated types under test, as pointers.
var gcTypes = []any{&gcAll{}, &gcOmit{}, &gcInner{}, &gcNode{}, &gcPayload{}, &gcTree{}, &gcMaps{}, &gcEmpty{}, &gcBig{}}

// gcSource hands out fuzz or random bytes; exhausted, it returns zeros.
type gcSource struct{ b []byte }

func (s *gcSource) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *gcSource) uint64() uint64 {
	var x [8]byte
	for i := range x {
		x[i] = s.byte()
	}
	return binary.LittleEndian.Uint64(x[:])
}

// gcEdgeInts are the boundaries of msgpack's integer encodings.
var gcEdgeInts = []int64{
	0, 1, -1, 31, 32, -31, -32, -33, 127, 128, -127, -128, -129, 255, 256,
	32767, 32768, -32768, -32769, 65535, 65536, math.MaxInt32, math.MaxInt32 + 1,
	math.MinInt32, math.MinInt32 - 1, math.MaxUint32, math.MaxUint32 + 1,
	math.MaxInt64, math.MinInt64,
}

func (s *gcSource) int() int64 {
	c := s.byte()
	if c < 160 {
		return gcEdgeInts[int(c)%len(gcEdgeInts)]
	}
	return int64(s.uint64())
}

func (s *gcSource) float() float64 {
	switch s.byte() % 8 {
	case 0:
		return 0
	case 1:
		return math.Copysign(0, -1)
	case 2:
		return math.NaN()
	case 3:
		return math.Inf(1 - 2*int(s.byte()%2))
	case 4:
		return float64(s.int())
	}
	return math.Float64frombits(s.uint64())
}

// length returns a length, mostly small, sometimes at an encoding boundary.
func (s *gcSource) length() int {
	c := s.byte()
	switch {
	case c < 200:
		return int(c % 20)
	case c < 252:
		return []int{15, 16, 31, 32, 255, 256}[c%6]
	}
	return []int{65535, 65536}[c%2]
}

func (s *gcSource) bytes() []byte {
	switch s.byte() % 4 {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	b := make([]byte, s.length())
	for i := range b {
		b[i] = s.byte()
	}
	return b
}

// fill sets v from s, within the range of its kind (a value out of range
// is not the encoders' business); depth bounds recursion.
func (s *gcSource) fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(s.byte()%2 == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(s.int()) // truncated to the kind by SetInt
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(s.int()))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(s.float())
	case reflect.String:
		v.SetString(string(s.bytes()))
	case reflect.Array:
		for i := range v.Len() {
			s.fill(v.Index(i), depth)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes(s.bytes())
			return
		}
		ek := v.Type().Elem().Kind()
		if (ek == reflect.Struct || ek == reflect.Pointer) && depth >= 4 {
			v.SetZero()
			return
		}
		switch s.byte() % 4 {
		case 0:
			v.SetZero()
		case 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		default:
			n := s.length() % 40
			sl := reflect.MakeSlice(v.Type(), n, n)
			for i := range n {
				s.fill(sl.Index(i), depth+1)
			}
			v.Set(sl)
		}
	case reflect.Map:
		switch s.byte() % 3 {
		case 0:
			v.SetZero()
		default:
			m := reflect.MakeMap(v.Type())
			for range s.length() % 10 {
				k := reflect.New(v.Type().Key()).Elem()
				e := reflect.New(v.Type().Elem()).Elem()
				s.fill(k, depth+1)
				s.fill(e, depth+1)
				m.SetMapIndex(k, e)
			}
			v.Set(m)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() && v.Type().Field(i).Tag.Get("msgpack") != "-" {
				s.fill(f, depth)
			}
		}
	case reflect.Pointer:
		if depth >= 4 || s.byte()%3 == 0 {
			v.SetZero()
			return
		}
		p := reflect.New(v.Type().Elem())
		s.fill(p.Elem(), depth+1)
		v.Set(p)
	}
}

// gcEqual is reflect.DeepEqual with floats compared by their bits (NaN)
// and, unless strict, a nil slice or map equal to an empty one: an
// omitempty field or one without the allownil tag does not keep the
// difference on the wire.
func gcEqual(a, b reflect.Value) bool { return gcEqualMode(a, b, false) }

func gcEqualMode(a, b reflect.Value, strict bool) bool {
	if a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Float32, reflect.Float64:
		if !strict && a.Float() == 0 && b.Float() == 0 {
			return true // msgp's omitempty omits -0, which then decodes as 0
		}
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.Slice:
		if strict && a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !gcEqualMode(a.Index(i), b.Index(i), strict) {
				return false
			}
		}
		return true
	case reflect.Array:
		for i := range a.Len() {
			if !gcEqualMode(a.Index(i), b.Index(i), strict) {
				return false
			}
		}
		return true
	case reflect.Map:
		if strict && a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for _, k := range a.MapKeys() {
			bv := b.MapIndex(k)
			if !bv.IsValid() || !gcEqualMode(a.MapIndex(k), bv, strict) {
				return false
			}
		}
		return true
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return gcEqualMode(a.Elem(), b.Elem(), strict)
	case reflect.Struct:
		for i := range a.NumField() {
			if !gcEqualMode(a.Field(i), b.Field(i), strict) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// decodeReflective decodes b into a new value of typ with vmihailenco
// alone, as MsgpackSerializer does for types without generated methods.
func decodeReflective(b []byte, typ reflect.Type) (reflect.Value, error) {
	p := reflect.New(typ)
	err := checkMsgpack(b, MaxMsgpackDepth)
	if err == nil {
		err = decodeMsgpackChecked(b, p.Interface())
	}
	return p, err
}

// decodeGen decodes b into a new value of typ with its generated
// UnmarshalMsg, as MsgpackSerializer does.
func decodeGen(b []byte, typ reflect.Type) (reflect.Value, error) {
	p := reflect.New(typ)
	return p, decodeGenerated(b, p.Interface().(msgp.Unmarshaler))
}

// checkInterchange encodes the value at p with the generated codec and with
// vmihailenco, decodes both encodings with both decoders, and fails unless
// all four give back the value.
func checkInterchange(t testing.TB, p reflect.Value) {
	t.Helper()
	typ := p.Type().Elem()
	gen, err := appendGenerated(nil, p.Interface().(msgp.Marshaler))
	if err != nil {
		t.Fatalf("%v: generated encoder: %v", typ, err)
	}
	ref, err := appendMsgpack(nil, p.Interface())
	if err != nil {
		t.Fatalf("%v: vmihailenco encoder: %v", typ, err)
	}
	for _, enc := range []struct {
		name string
		b    []byte
	}{{"generated", gen}, {"vmihailenco", ref}} {
		for _, dec := range []struct {
			name string
			f    func([]byte, reflect.Type) (reflect.Value, error)
		}{{"generated", decodeGen}, {"vmihailenco", decodeReflective}} {
			got, err := dec.f(enc.b, typ)
			if err != nil {
				t.Fatalf("%v: %s decoder on %s encoding %.200x: %v", typ, dec.name, enc.name, enc.b, err)
			}
			if !gcEqual(got.Elem(), p.Elem()) {
				t.Fatalf("%v: %s decoder on %s encoding:\n got %+v\nwant %+v", typ, dec.name, enc.name, got.Elem().Interface(), p.Elem().Interface())
			}
		}
	}
}

func TestGeneratedCodecDifferentialRandom(t *testing.T) {
	rng := rand.NewChaCha8([32]byte{1, 2})
	raw := make([]byte, 16<<10)
	n := 300
	if testing.Short() {
		n = 30
	}
	for _, sample := range gcTypes {
		typ := reflect.TypeOf(sample).Elem()
		for range n {
			_, _ = rng.Read(raw)
			p := reflect.New(typ)
			(&gcSource{b: raw}).fill(p.Elem(), 0)
			checkInterchange(t, p)
		}
	}
}

func TestGeneratedCodecEdgeValues(t *testing.T) {
	for _, v := range []any{
		&gcAll{}, &gcOmit{}, &gcTree{}, &gcMaps{}, &gcEmpty{},
		&gcAll{B: []byte{}, Ints: []int{}, Strs: []string{}, Blob: gcBlob{}, PIn: &gcInner{C: []uint16{}}},
		&gcAll{I: math.MinInt64, U: math.MaxUint64, U64: math.MaxUint64, I8: -128, F32: float32(math.Inf(-1)), F64: math.NaN(), D: -1},
		&gcAll{S: strings.Repeat("s", 70000), B: make([]byte, 70000), Ints: make([]int, 70000)},
		&gcOmit{B: []byte{}, Strs: []string{}, F64s: []float64{}, PIn: &gcInner{}},
		&gcNode{V: 1, Next: &gcNode{V: 2, Next: &gcNode{V: 3}}},
		&gcTree{Kids: []gcTree{{Name: "a", Kids: []gcTree{}}}, Refs: []*gcInner{nil, {A: 1}}, Nodes: []*gcNode{nil}},
		&gcMaps{M: map[string]string{}, N: map[string]int64{"a": -1, "b": math.MaxInt64}, O: map[string]gcInner{"x": {B: "y"}}},
	} {
		checkInterchange(t, reflect.ValueOf(v))
	}
}

// TestGeneratedCodecAllowNil: fields tagged allownil (and not omitempty)
// keep nil and empty apart both ways, as vmihailenco does.
func TestGeneratedCodecAllowNil(t *testing.T) {
	for _, v := range []*gcAll{
		{},
		{B: []byte{}, Ints: []int{}, Strs: []string{}, Names: []gcName{}, Blob: gcBlob{}, F64s: []float64{}},
	} {
		gen, _ := v.MarshalMsg(nil)
		ref, err := appendMsgpack(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{gen, ref} {
			for _, dec := range []func([]byte, reflect.Type) (reflect.Value, error){decodeGen, decodeReflective} {
				got, err := dec(b, reflect.TypeFor[gcAll]())
				if err != nil {
					t.Fatal(err)
				}
				if !gcEqualMode(got.Elem(), reflect.ValueOf(v).Elem(), true) {
					t.Fatalf("nil and empty mixed up:\n got %#v\nwant %#v", got.Elem().Interface(), *v)
				}
			}
		}
	}
}

// TestGeneratedCodecRegistry: a registered generated type goes through its
// generated methods both ways (the registry's fast path), as a pointer or a
// value, and a reflective registration of the same wire name decodes it.
func TestGeneratedCodecRegistry(t *testing.T) {
	r := NewRegistry()
	if err := r.Register("big", &gcBig{}); err != nil {
		t.Fatal(err)
	}
	if rt := r.tables.Load().byName["big"]; !rt.gen {
		t.Fatal("gcBig is not on the generated path")
	}
	in := &gcBig{Step: 7, Name: "n", Shape: []int64{2, 3}, Values: []float32{1.5}, Parent: &gcNode{V: 1}, Payload: []byte{1, 2}}
	for _, msg := range []any{in, *in} {
		name, ser, body, err := r.AppendEncode([]byte("prefix"), msg)
		if err != nil || name != "big" || ser != SerMsgpack || string(body[:6]) != "prefix" {
			t.Fatalf("AppendEncode(%T) = %q %d %v", msg, name, ser, err)
		}
		want, _ := in.MarshalMsg(nil)
		if !bytes.Equal(body[6:], want) {
			t.Fatalf("AppendEncode(%T) did not use MarshalMsg:\n%x\n%x", msg, body[6:], want)
		}
		out, err := r.Decode("big", SerMsgpack, body[6:])
		if err != nil {
			t.Fatal(err)
		}
		if !gcEqual(reflect.ValueOf(out).Elem(), reflect.ValueOf(in).Elem()) {
			t.Fatalf("got %+v, want %+v", out, in)
		}
	}
	// A peer without generated code registers the same fields reflectively.
	type plainBig struct {
		Step    int64
		Name    string
		Shape   []int64
		Values  []float32
		Labels  []string
		Weight  float64
		Done    bool
		Meta    struct{ A int8 }
		Parent  *struct{ V int }
		Payload []byte
	}
	r2 := NewRegistry()
	r2.MustRegister("big", &plainBig{})
	_, _, body, err := r.AppendEncode(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := r2.Decode("big", SerMsgpack, body)
	if err != nil {
		t.Fatal(err)
	}
	if p := out.(*plainBig); p.Step != 7 || p.Shape[1] != 3 || p.Parent.V != 1 || !bytes.Equal(p.Payload, in.Payload) {
		t.Fatalf("reflective peer decoded %+v", p)
	}
	_, _, body, err = r2.AppendEncode(nil, out)
	if err != nil {
		t.Fatal(err)
	}
	back, err := r.Decode("big", SerMsgpack, body)
	if err != nil {
		t.Fatal(err)
	}
	if b := back.(*gcBig); b.Step != 7 || b.Values[0] != 1.5 || b.Parent.V != 1 {
		t.Fatalf("generated peer decoded %+v", b)
	}
}

// TestGeneratedCodecHostile: bodies that declare more than they hold are
// refused before the generated decoder sizes anything from them.
func TestGeneratedCodecHostile(t *testing.T) {
	for _, tc := range []struct{ name, hex string }{
		{"array count beyond input", "81 a5536861706500 dd7fffffff 01"},
		{"map count beyond input", "81 a14d df7fffffff a0a0"},
		{"bin length beyond input", "81 a7 5061796c6f6164 c6 7fffffff 00"},
		{"nested too deep", "81 a44b696473" + strings.Repeat("91 81 a44b696473", 40) + "90"},
		{"trailing bytes", "80 80"},
		{"truncated", "82 a14e"},
		{"wrong type", "81 a45374657000 a178"},
	} {
		b := unhex(t, tc.hex)
		for _, sample := range []any{&gcBig{}, &gcMaps{}, &gcPayload{}, &gcTree{}} {
			var err error
			n := allocatedBytes(func() { _, err = decodeGen(b, reflect.TypeOf(sample).Elem()) })
			if tc.name != "wrong type" && !errors.Is(err, ErrBadBody) {
				t.Errorf("%s into %T: err %v, want ErrBadBody", tc.name, sample, err)
			}
			if n > 64<<10 {
				t.Errorf("%s into %T: %d bytes allocated for %d bytes of input", tc.name, sample, n, len(b))
			}
		}
	}
}

// gcFuzzSeeds adds encodings of a few values of every generated type.
func gcFuzzSeeds(f *testing.F) {
	rng := rand.NewChaCha8([32]byte{3})
	raw := make([]byte, 512)
	for _, sample := range gcTypes {
		typ := reflect.TypeOf(sample).Elem()
		for range 3 {
			_, _ = rng.Read(raw)
			p := reflect.New(typ)
			(&gcSource{b: raw}).fill(p.Elem(), 2)
			if b, err := appendMsgpack(nil, p.Interface()); err == nil && len(b) < 4<<10 {
				f.Add(b)
			}
		}
	}
}

// FuzzGeneratedDecode: generated decoders never panic, allocate in
// proportion to their input, and whatever both they and vmihailenco
// accept decodes to the same value.
func FuzzGeneratedDecode(f *testing.F) {
	gcFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, sample := range gcTypes {
			typ := reflect.TypeOf(sample).Elem()
			var got reflect.Value
			var err error
			if n := allocatedBytes(func() { got, err = decodeGen(in, typ) }); n > uint64(64<<10+512*len(in)) {
				t.Fatalf("%v: %d bytes allocated for %d bytes of input", typ, n, len(in))
			}
			if err != nil {
				if !errors.Is(err, ErrBadBody) {
					t.Fatalf("%v: error %v does not wrap ErrBadBody", typ, err)
				}
				continue
			}
			ref, err := decodeReflective(in, typ)
			if err == nil && !gcEqual(got.Elem(), ref.Elem()) {
				t.Fatalf("%v from %x:\ngenerated   %+v\nvmihailenco %+v", typ, in, got.Elem().Interface(), ref.Elem().Interface())
			}
		}
	})
}

// FuzzGeneratedRoundTrip: a value built from fuzz bytes survives every
// combination of encoder and decoder.
func FuzzGeneratedRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Add(bytes.Repeat([]byte{7, 200, 3}, 100))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, sample := range gcTypes {
			p := reflect.New(reflect.TypeOf(sample).Elem())
			(&gcSource{b: in}).fill(p.Elem(), 0)
			checkInterchange(t, p)
		}
	})
}

func benchGenerated(b *testing.B, msg any, reflective bool) {
	r := NewRegistry()
	var err error
	if reflective {
		err = r.RegisterSerializer("m", msg, reflectiveSerializer{})
	} else {
		err = r.Register("m", msg)
	}
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		_, _, body, err := r.AppendEncode(buf[:0], msg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.Decode("m", SerMsgpack, body); err != nil {
			b.Fatal(err)
		}
	}
}

// reflectiveSerializer is MsgpackSerializer without the generated fast
// path, for the benchmarks' baseline.
type reflectiveSerializer struct{ MsgpackSerializer }

func (reflectiveSerializer) AppendMarshal(dst []byte, v any) ([]byte, error) {
	return appendMsgpack(dst, v)
}

func (reflectiveSerializer) Unmarshal(b []byte, typ reflect.Type) (any, error) {
	p, err := decodeReflective(b, typ)
	if err != nil {
		return nil, err
	}
	return p.Interface(), nil
}

func gcBigSample() *gcBig {
	return &gcBig{Step: 12345, Name: "layer3.weight", Shape: []int64{128, 64}, Values: make([]float32, 32),
		Labels: []string{"a", "bb", "ccc"}, Weight: 0.5, Done: true, Meta: gcInner{A: 3, B: "meta"},
		Parent: &gcNode{V: 1}, Payload: make([]byte, 64)}
}

func BenchmarkRoundTripPayload64Generated(b *testing.B) {
	benchGenerated(b, &gcPayload{Payload: make([]byte, 64)}, false)
}

func BenchmarkRoundTripPayload64Reflective(b *testing.B) {
	benchGenerated(b, &gcPayload{Payload: make([]byte, 64)}, true)
}

func BenchmarkRoundTripBigGenerated(b *testing.B)  { benchGenerated(b, gcBigSample(), false) }
func BenchmarkRoundTripBigReflective(b *testing.B) { benchGenerated(b, gcBigSample(), true) }
