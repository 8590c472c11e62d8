package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Types the compiled codec must handle.

type scName string

type scSmall int16

type scBlob []byte

type scInner struct {
	A int8
	B string   `msgpack:"b,omitempty"`
	C []uint16 `msgpack:",omitempty"`
}

type scAll struct {
	Bool    bool
	I       int
	I8      int8
	I16     int16
	I32     int32
	I64     int64
	U       uint
	U8      uint8
	U16     uint16
	U32     uint32
	U64     uint64
	F32     float32
	F64     float64
	S       string
	B       []byte
	Arr     [4]byte
	Arr0    [0]byte
	Bools   []bool
	Ints    []int
	I8s     []int8
	I16s    []int16
	I32s    []int32
	I64s    []int64
	Uints   []uint
	U16s    []uint16
	U32s    []uint32
	U64s    []uint64
	F32s    []float32
	F64s    []float64
	Strs    []string
	Names   []scName
	Smalls  []scSmall
	Named   scName
	Small   scSmall
	Blob    scBlob
	In      scInner
	PIn     *scInner
	Renamed int `msgpack:"r"`
	Skipped int `msgpack:"-"`
	hidden  int
}

type scOmit struct {
	Bool  bool      `msgpack:",omitempty"`
	I     int       `msgpack:",omitempty"`
	I8    int8      `msgpack:",omitempty"`
	I16   int16     `msgpack:",omitempty"`
	I32   int32     `msgpack:",omitempty"`
	U64   uint64    `msgpack:",omitempty"`
	U8    uint8     `msgpack:",omitempty"`
	F32   float32   `msgpack:",omitempty"`
	F64   float64   `msgpack:",omitempty"`
	S     string    `msgpack:"s,omitempty"`
	B     []byte    `msgpack:",omitempty"`
	Arr   [2]byte   `msgpack:",omitempty"`
	Arr0  [0]byte   `msgpack:",omitempty"`
	Strs  []string  `msgpack:",omitempty"`
	F64s  []float64 `msgpack:",omitempty"`
	In    scInner   `msgpack:",omitempty"` // empty only when all its fields are omitempty and empty (never: A is not)
	Empty scAllOmit `msgpack:",omitempty"` // empty when all its fields are empty
	None  struct{}  `msgpack:",omitempty"` // always empty
	PIn   *scInner  `msgpack:",omitempty"`
	Last  int
}

type scAllOmit struct {
	X int    `msgpack:",omitempty"`
	Y string `msgpack:",omitempty"`
}

type scNode struct {
	V    int
	Next *scNode
}

type scPayload struct{ Payload []byte }

// scTree nests through slices of structs and of pointers to structs.
type scTree struct {
	Name  string
	Kids  []scTree
	Refs  []*scInner `msgpack:",omitempty"`
	Nodes []*scNode
}

// scSingle is pointer-shaped: an interface holds it in its data word.
type scSingle struct{ P *scInner }

type scEmpty struct{}

type scMany struct {
	F00, F01, F02, F03, F04, F05, F06, F07, F08, F09 int
	F10, F11, F12, F13, F14, F15, F16, F17, F18, F19 string
}

type scBig struct {
	Step    int64
	Name    string
	Shape   []int64
	Values  []float32
	Labels  []string
	Weight  float64
	Done    bool
	Meta    scInner
	Parent  *scNode
	Payload []byte
}

// scTypes are the compiled sample types, with a sample value each.
var scTypes = []any{
	scAll{}, scOmit{}, scNode{}, scTree{}, scPayload{}, scSingle{}, scEmpty{}, scMany{}, scBig{}, scInner{}, scAllOmit{},
}

// Types the compiled codec must leave to vmihailenco.

type scWithIface struct{ X any }
type scWithMap struct{ M map[string]string }
type scWithTime struct{ T time.Time }
type scWithDuration struct{ D time.Duration } // compiled: a plain int64
type scTextInt int

func (scTextInt) MarshalText() ([]byte, error) { return []byte("t"), nil }

type scWithText struct{ X scTextInt }
type scWithTextSlice struct{ X []scTextInt }
type scZeroer struct{ X int }

func (scZeroer) IsZero() bool { return true }

type scWithZeroer struct {
	Z scZeroer `msgpack:",omitempty"`
}
type scCustom struct{ X int }

func (*scCustom) EncodeMsgpack(e *msgpack.Encoder) error              { return e.EncodeInt(1) }
func (*scCustom) DecodeMsgpack(d *msgpack.Decoder) error              { return d.Skip() }
func (scMarshaler) MarshalMsgpack() ([]byte, error)                   { return []byte{0xc0}, nil }
func (*scMarshaler) UnmarshalMsgpack(b []byte) error                  { return nil }
func (scBinary) MarshalBinary() ([]byte, error)                       { return nil, nil }
func (*scBinary) UnmarshalBinary(b []byte) error                      { return nil }
func (*scTextUnmarshaler) UnmarshalText(b []byte) error               { return nil }
func (scRegistered) encode(e *msgpack.Encoder, v reflect.Value) error { return e.EncodeString("r") }

type scMarshaler struct{ X int }
type scBinary struct{ X int }
type scTextUnmarshaler struct{ X int }
type scRegistered int32
type scExtRegistered struct{ X int }
type scNestedCustomHolder struct{ In struct{ C scCustom } }
type scPtrCustomHolder struct{ C *scCustom }
type scSliceStructHolder struct{ S []scWithIface }
type scPtrIntHolder struct{ P *int }
type scUintptrHolder struct{ P uintptr }
type scComplexHolder struct{ C complex128 }
type scChanHolder struct{ C chan int }
type scIntArrayHolder struct{ A [2]int }
type scEmbedded struct {
	scInner
	X int
}
type scAsArray struct {
	_msgpack struct{} `msgpack:",as_array"`
	X        int
}
type scIntern struct {
	S string `msgpack:",intern"`
}
type scAlias struct {
	S string `msgpack:"s,alias:t"`
}
type scDupName struct {
	A int `msgpack:"x"`
	B int `msgpack:"x"`
}
type scQuoted struct {
	S string `msgpack:"'a,b'"`
}
type scTrailingComma struct {
	S string `msgpack:"s,"`
}
type scUnexportedEmbedded struct {
	scAllOmit
}
type scTooMany struct {
	A00, A01, A02, A03, A04, A05, A06, A07, A08, A09 int
	A10, A11, A12, A13, A14, A15, A16, A17, A18, A19 int
	A20, A21, A22, A23, A24, A25, A26, A27, A28, A29 int
	A30, A31, A32, A33, A34, A35, A36, A37, A38, A39 int
	A40, A41, A42, A43, A44, A45, A46, A47, A48, A49 int
	A50, A51, A52, A53, A54, A55, A56, A57, A58, A59 int
	A60, A61, A62, A63, A64                          int
}
type scInlineTag struct {
	In scInner `msgpack:",inline"`
}
type scNoInlineEmbedded struct {
	*scInner `msgpack:",noinline"`
}
type scWithCustomField struct{ C scCustom }
type scWithMarshalerField struct{ M scMarshaler }
type scWithBinaryField struct{ B []scBinary }
type scWithTextUnmarshalerField struct{ T *scTextUnmarshaler }
type scWithRegisteredField struct{ R scRegistered }
type scWithExtRegisteredField struct{ E scExtRegistered }

func init() {
	// A plain type with an encoder registered the low-level way: only the
	// probe at compile time can notice it.
	msgpack.Register(scRegistered(0), scRegistered(0).encode, func(d *msgpack.Decoder, v reflect.Value) error {
		_, err := d.DecodeString()
		return err
	})
	msgpack.RegisterExtEncoder(77, scExtRegistered{}, func(e *msgpack.Encoder, v reflect.Value) ([]byte, error) {
		return []byte{1}, nil
	})
}

var scRejected = []any{
	scWithIface{}, scWithMap{}, scWithTime{}, scWithText{}, scWithTextSlice{}, scWithZeroer{},
	scCustom{}, scMarshaler{}, scBinary{}, scTextUnmarshaler{},
	scNestedCustomHolder{}, scPtrCustomHolder{}, scSliceStructHolder{}, scPtrIntHolder{},
	scUintptrHolder{}, scComplexHolder{}, scChanHolder{}, scIntArrayHolder{}, scEmbedded{},
	scAsArray{}, scIntern{}, scAlias{}, scDupName{}, scQuoted{}, scTrailingComma{},
	scUnexportedEmbedded{}, scTooMany{}, scInlineTag{}, scNoInlineEmbedded{},
	scWithCustomField{}, scWithMarshalerField{}, scWithBinaryField{},
	scWithTextUnmarshalerField{}, scWithRegisteredField{}, scWithExtRegisteredField{},
}

func TestStructCodecCompiles(t *testing.T) {
	for _, s := range append(scTypes, scWithDuration{}) {
		if structCodecOf(s) == nil {
			t.Errorf("%T: not compiled", s)
		}
	}
	for _, s := range scRejected {
		if c := structCodecOf(s); c != nil {
			t.Errorf("%T: compiled, want it left to vmihailenco", s)
		}
	}
	if structCodecFor(reflect.TypeFor[int]()) != nil || structCodecOf(nil) != nil {
		t.Error("a non-struct got a codec")
	}
	if !structCodecOf(scSingle{}).direct || structCodecOf(scPayload{}).direct {
		t.Error("pointer-shaped types misjudged")
	}
}

func TestParseMsgpackTag(t *testing.T) {
	for _, tc := range []struct {
		tag, name string
		omit, ok  bool
	}{
		{"", "", false, true},
		{"x", "x", false, true},
		{"-", "-", false, true},
		{"-,omitempty", "-", false, true},
		{",omitempty", "", true, true},
		{"x,omitempty", "x", true, true},
		{"x,omitempty,omitempty", "x", true, true},
		{"x,", "", false, false},
		{"x,intern", "", false, false},
		{"x,alias:y", "", false, false},
		{"'x'", "", false, false},
		{"x, omitempty", "", false, false},
		{"x,as_array", "", false, false},
	} {
		name, omit, ok := parseMsgpackTag(tc.tag)
		if name != tc.name || omit != tc.omit || ok != tc.ok {
			t.Errorf("parseMsgpackTag(%q) = %q %v %v, want %q %v %v", tc.tag, name, omit, ok, tc.name, tc.omit, tc.ok)
		}
	}
}

// scSource hands out fuzz or random bytes; exhausted, it returns zeros.
type scSource struct{ b []byte }

func (s *scSource) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *scSource) uint64() uint64 {
	var x [8]byte
	for i := range x {
		x[i] = s.byte()
	}
	return binary.LittleEndian.Uint64(x[:])
}

// scEdgeInts are the boundaries of msgpack's integer encodings.
var scEdgeInts = []int64{
	0, 1, -1, 31, 32, -31, -32, -33, 127, 128, -127, -128, -129, 255, 256,
	32767, 32768, -32768, -32769, 65535, 65536, math.MaxInt32, math.MaxInt32 + 1,
	math.MinInt32, math.MinInt32 - 1, math.MaxUint32, math.MaxUint32 + 1,
	math.MaxInt64, math.MinInt64,
}

func (s *scSource) int() int64 {
	c := s.byte()
	if c < 160 {
		return scEdgeInts[int(c)%len(scEdgeInts)]
	}
	return int64(s.uint64())
}

func (s *scSource) float() float64 {
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
func (s *scSource) length() int {
	c := s.byte()
	switch {
	case c < 200:
		return int(c % 20)
	case c < 252:
		return []int{15, 16, 31, 32, 255, 256}[c%6]
	}
	return []int{65535, 65536}[c%2]
}

func (s *scSource) bytes() []byte {
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

// fill sets v (a settable value of a type the compiled codec supports) from
// s; depth bounds recursion through pointers.
func (s *scSource) fill(v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(s.byte()%2 == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(s.int())
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
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				s.fill(f, depth)
			} else if v.CanAddr() {
				// Unexported fields are not encoded; give them a value
				// anyway to show they are ignored.
				f = reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem()
				if f.Kind() == reflect.Int {
					f.SetInt(s.int())
				}
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

// scEqual is reflect.DeepEqual with floats compared by their bits (NaN).
func scEqual(a, b reflect.Value) bool {
	if a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Float32, reflect.Float64:
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.Slice:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !scEqual(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Array:
		for i := range a.Len() {
			if !scEqual(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return scEqual(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := range a.NumField() {
			if !scEqual(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return a.Uint() == b.Uint()
	case reflect.String:
		return a.String() == b.String()
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// checkEncode compares the compiled encoding of the value at p (a pointer)
// with vmihailenco's, for the pointer and for the value, and returns it.
func checkEncode(t testing.TB, p reflect.Value) []byte {
	t.Helper()
	c := structCodecFor(p.Type().Elem())
	want, err := appendMsgpack(nil, p.Interface())
	if err != nil {
		t.Fatalf("vmihailenco: %v", err)
	}
	for _, v := range []any{p.Interface(), p.Elem().Interface()} {
		got, ok := c.appendValue([]byte("prefix"), v)
		if !ok || !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
			t.Fatalf("%T %+v:\ncompiled    %x (%v)\nvmihailenco %x", v, p.Elem().Interface(), got, ok, want)
		}
	}
	return want
}

// checkDecode decodes b with the compiled codec (fast path and fallback)
// and with vmihailenco alone, and fails unless both give the same value or
// both an error. It reports whether the fast path decoded b.
func checkDecode(t testing.TB, typ reflect.Type, b []byte) (fast bool) {
	t.Helper()
	c := structCodecFor(typ)
	ref := reflect.New(typ)
	refErr := DecodeMsgpack(b, ref.Interface())
	got, err := c.unmarshal(b)
	if (err != nil) != (refErr != nil) {
		t.Fatalf("%v from %x: compiled error %v, vmihailenco error %v", typ, b, err, refErr)
	}
	fp := reflect.New(typ)
	fast = c.decodeFast(b, fp.UnsafePointer())
	if fast && checkMsgpack(b, MaxMsgpackDepth) != nil {
		// The fast path accepts a subset of what checkMsgpack accepts.
		t.Fatalf("%v from %x: fast path decoded what checkMsgpack refuses (%v)", typ, b, checkMsgpack(b, MaxMsgpackDepth))
	}
	if fast {
		if refErr != nil {
			t.Fatalf("%v from %x: fast path decoded what vmihailenco refuses (%v)", typ, b, refErr)
		}
		if !scEqual(fp.Elem(), ref.Elem()) {
			t.Fatalf("%v from %x: fast path\n%+v\nvmihailenco\n%+v", typ, b, fp.Elem().Interface(), ref.Elem().Interface())
		}
	}
	if err == nil && !scEqual(reflect.ValueOf(got).Elem(), ref.Elem()) {
		t.Fatalf("%v from %x: compiled\n%+v\nvmihailenco\n%+v", typ, b, got, ref.Elem().Interface())
	}
	return fast
}

func TestStructCodecDifferentialRandom(t *testing.T) {
	rng := rand.NewChaCha8([32]byte{1, 2})
	raw := make([]byte, 16<<10)
	n := 600
	if testing.Short() {
		n = 60
	}
	for _, sample := range scTypes {
		typ := reflect.TypeOf(sample)
		for range n {
			_, _ = rng.Read(raw)
			p := reflect.New(typ)
			(&scSource{b: raw}).fill(p.Elem(), 0)
			b := checkEncode(t, p)
			if !checkDecode(t, typ, b) {
				t.Fatalf("%v: fast path refused the encoder's own output %x", typ, b)
			}
		}
	}
}

func TestStructCodecEncodeTable(t *testing.T) {
	in := &scInner{A: -5, B: "b", C: []uint16{1, 300}}
	long := strings.Repeat("x", 70000)
	for _, v := range []any{
		&scAll{},
		&scAll{Bool: true, I: -1, I8: -128, I16: 300, I32: -70000, I64: math.MinInt64, U: 1 << 40, U8: 255,
			U16: 65535, U32: 1 << 31, U64: math.MaxUint64, F32: 1.5, F64: math.Inf(-1), S: long, B: []byte(long),
			Arr: [4]byte{1, 2, 3, 4}, Bools: []bool{true, false}, Ints: make([]int, 70000), Strs: []string{"", "a"},
			Names: []scName{"n"}, Smalls: []scSmall{-1}, Named: "named", Small: 7, Blob: scBlob{}, In: *in, PIn: in,
			Renamed: 9, Skipped: 10, hidden: 11},
		&scOmit{},
		&scOmit{Empty: scAllOmit{X: 1}, PIn: &scInner{}, F64: math.Copysign(0, -1), F32: float32(math.NaN()), Strs: []string{}},
		&scOmit{B: []byte{}, Arr: [2]byte{}, S: "s", Bool: true, U8: 1},
		&scNode{V: 1, Next: &scNode{V: 2, Next: &scNode{V: 3}}},
		&scPayload{Payload: bytes.Repeat([]byte{0xab}, 64)},
		&scPayload{Payload: make([]byte, 300)},
		&scSingle{P: in}, &scSingle{},
		&scEmpty{},
		&scMany{F19: "last"},
		&scWithDuration{D: time.Second},
		&scTree{Name: "root", Kids: []scTree{{Name: "a", Refs: []*scInner{nil, in}}, {}}, Nodes: []*scNode{nil, {V: 1}}},
		&scTree{Kids: []scTree{}, Refs: []*scInner{}, Nodes: make([]*scNode, 20)},
	} {
		checkEncode(t, reflect.ValueOf(v))
	}
}

// TestStructCodecDeepPointers: a chain deeper than the compiled encoder
// goes is handed to vmihailenco, with the same result.
func TestStructCodecDeepPointers(t *testing.T) {
	var head *scNode
	for i := range scMaxEncodeDepth + 10 {
		head = &scNode{V: i, Next: head}
	}
	c := structCodecOf(head)
	if _, ok := c.appendValue(nil, head); ok {
		t.Fatal("compiled encoder took a value nested beyond scMaxEncodeDepth")
	}
	got, err := MsgpackSerializer{}.Marshal(head)
	want, err2 := appendMsgpack(nil, head)
	if err != nil || err2 != nil || !bytes.Equal(got, want) {
		t.Fatalf("Marshal of a deep chain: %v %v, equal %v", err, err2, bytes.Equal(got, want))
	}
	if _, ok := c.appendValue(nil, (*scNode)(nil)); ok {
		t.Fatal("compiled encoder took a nil pointer")
	}
	if _, ok := c.appendValue(nil, scPayload{}); ok {
		t.Fatal("compiled encoder took a value of another type")
	}
}

// TestStructCodecDecodeDepth: nesting near MaxMsgpackDepth decodes as in
// vmihailenco, and the fast path stays within checkMsgpack's limit.
func TestStructCodecDecodeDepth(t *testing.T) {
	for n := MaxMsgpackDepth - 4; n <= MaxMsgpackDepth+2; n++ {
		head := &scNode{V: -1}
		for i := range n - 1 {
			head = &scNode{V: i, Next: head}
		}
		b := checkEncode(t, reflect.ValueOf(head))
		checkDecode(t, reflect.TypeFor[scNode](), b)
		big := &scBig{Parent: head}
		b = checkEncode(t, reflect.ValueOf(big))
		checkDecode(t, reflect.TypeFor[scBig](), b)
		in := &scAll{PIn: &scInner{C: []uint16{1}}}
		checkDecode(t, reflect.TypeFor[scAll](), checkEncode(t, reflect.ValueOf(in)))
	}
	// Each level of a tree is a map and an array.
	for n := MaxMsgpackDepth/2 - 3; n <= MaxMsgpackDepth/2+1; n++ {
		tree := scTree{Refs: []*scInner{{C: []uint16{1}}}}
		for range n - 1 {
			tree = scTree{Kids: []scTree{tree}}
		}
		checkDecode(t, reflect.TypeFor[scTree](), checkEncode(t, reflect.ValueOf(&tree)))
	}
}

// scMap encodes m (string keys, any values) with vmihailenco: keys in sorted
// order, which is not the order of declaration.
func scMap(t testing.TB, m map[string]any) []byte {
	t.Helper()
	b, err := appendMsgpack(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func unhexBytes(t testing.TB, s string) []byte {
	t.Helper()
	var b []byte
	for f := range strings.FieldsSeq(s) {
		for i := 0; i+1 < len(f); i += 2 {
			var x byte
			if _, err := fmt.Sscanf(f[i:i+2], "%02x", &x); err != nil {
				t.Fatalf("bad hex %q", f)
			}
			b = append(b, x)
		}
	}
	return b
}

// TestStructCodecDecodeVariants: inputs the encoder does not produce decode
// as vmihailenco decodes them, through the fast path where it is sure and
// through vmihailenco otherwise.
func TestStructCodecDecodeVariants(t *testing.T) {
	all := reflect.TypeFor[scAll]()
	inner := reflect.TypeFor[scInner]()
	payload := reflect.TypeFor[scPayload]()
	node := reflect.TypeFor[scNode]()
	tree := reflect.TypeFor[scTree]()
	for _, tc := range []struct {
		name string
		typ  reflect.Type
		b    []byte
		fast bool
	}{
		{"fields in sorted order", all, scMap(t, map[string]any{"Bool": true, "I": 5, "S": "s", "r": 3, "In": map[string]any{"A": 1, "b": "x"}, "F64s": []any{1, 2.5}}), true},
		{"missing fields", inner, scMap(t, map[string]any{"b": "only"}), true},
		{"empty map", inner, []byte{0x80}, true},
		{"nil struct", inner, []byte{0xc0}, true},
		{"nil values", all, scMap(t, map[string]any{"I": nil, "S": nil, "B": nil, "F32": nil, "Bool": nil, "Ints": nil, "In": nil, "PIn": nil, "Arr": nil}), true},
		{"wide ints truncated", all, scMap(t, map[string]any{"I8": 300, "U8": -1, "I16": int64(math.MaxInt64), "U32": -5, "U": -1}), true},
		{"ints for floats", all, scMap(t, map[string]any{"F32": 7, "F64": -9, "F32s": []any{1, uint64(math.MaxUint64)}}), true},
		{"float32 for float64", all, scMap(t, map[string]any{"F64": float32(1.25)}), true},
		{"float64 for float32", all, scMap(t, map[string]any{"F32": 1.25}), false},
		{"str for bytes", all, scMap(t, map[string]any{"B": "str", "Arr": "ab"}), true},
		{"bin for string", all, scMap(t, map[string]any{"S": []byte("bin")}), true},
		{"bytes array too long", all, scMap(t, map[string]any{"Arr": []byte("12345")}), false},
		{"float for int", all, scMap(t, map[string]any{"I": 1.5}), false},
		{"string for int", all, scMap(t, map[string]any{"I": "1"}), false},
		{"int for bool", all, scMap(t, map[string]any{"Bool": 1}), false},
		{"unknown key", inner, scMap(t, map[string]any{"A": 1, "Z": []any{1, "x"}}), false},
		{"skipped field's key", all, scMap(t, map[string]any{"Skipped": 4}), false},
		{"hidden field's key", all, scMap(t, map[string]any{"hidden": 4}), false},
		{"declared name instead of tag name", all, scMap(t, map[string]any{"Renamed": 4}), false},
		{"repeated key", inner, unhexBytes(t, "82 a141 01 a141 02"), false},
		{"repeated nested struct merges", all, unhexBytes(t, "82 a2496e 81a141 01 a2496e 81a162 a178"), false},
		{"array-encoded struct", inner, unhexBytes(t, "93 01 a162 90"), false},
		{"array-encoded struct, wrong count", inner, unhexBytes(t, "92 01 a162"), false},
		{"empty array for struct", inner, unhexBytes(t, "90"), false},
		{"bin key", inner, unhexBytes(t, "81 c40141 05"), false},
		{"nil key", inner, unhexBytes(t, "81 c0 05"), false},
		{"int key", inner, unhexBytes(t, "81 01 05"), false},
		{"map16 and str8 key", inner, unhexBytes(t, "de0001 d90141 05"), true},
		{"map32 and str16 key", inner, unhexBytes(t, "df00000001 da000141 05"), true},
		{"array16 of uint16", inner, unhexBytes(t, "81 a143 dc0002 01 cd0100"), true},
		{"array32 of uint16", inner, unhexBytes(t, "81 a143 dd00000001 01"), true},
		{"map for a slice", inner, unhexBytes(t, "81 a143 80"), false},
		{"ext for a field", inner, unhexBytes(t, "81 a141 d40100"), false},
		{"truncated", inner, unhexBytes(t, "81 a141"), false},
		{"trailing byte", inner, unhexBytes(t, "80 00"), false},
		{"not a map", payload, unhexBytes(t, "a3616263"), false},
		{"bin32 payload", payload, unhexBytes(t, "81 a75061796c6f6164 c600000003 010203"), true},
		{"empty bin", payload, unhexBytes(t, "81 a75061796c6f6164 c400"), true},
		{"recursive", node, scMap(t, map[string]any{"V": 1, "Next": map[string]any{"V": 2, "Next": nil}}), true},
		{"slices of structs in sorted order", tree, scMap(t, map[string]any{"Name": "n", "Kids": []any{map[string]any{"Name": "k", "Refs": []any{nil, map[string]any{"A": 1}}}, nil}, "Nodes": []any{}}), true},
		{"array-encoded struct in a slice", tree, scMap(t, map[string]any{"Kids": []any{[]any{"k", nil, nil, nil}}}), false},
		{"unknown key in a slice element", tree, scMap(t, map[string]any{"Nodes": []any{map[string]any{"V": 1, "W": 2}}}), false},
		{"int in a slice of structs", tree, scMap(t, map[string]any{"Kids": []any{1}}), false},
		{"pointer as array", node, unhexBytes(t, "81 a44e657874 92 01 c0"), false},
		{"hostile length", payload, unhexBytes(t, "81 a75061796c6f6164 c6ffffffff 00"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fast := checkDecode(t, tc.typ, tc.b); fast != tc.fast {
				t.Errorf("fast path: %v, want %v", fast, tc.fast)
			}
		})
	}
}

// TestStructCodecNoAliasing: decoded bytes and strings are copies, so the
// caller may reuse the body buffer.
func TestStructCodecNoAliasing(t *testing.T) {
	in := &scAll{S: "string value", B: []byte("bytes value"), Strs: []string{"a string"}, Named: "named", Blob: scBlob("blob"), In: scInner{B: "inner"}}
	b := checkEncode(t, reflect.ValueOf(in))
	out, err := structCodecOf(in).unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	clear(b)
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("decoded value changed with its input:\n%+v\n%+v", out, in)
	}
}

func TestStructCodecRegistry(t *testing.T) {
	r := NewRegistry()
	r.MustRegister("payload", &scPayload{})
	r.MustRegister("iface", scWithIface{})
	if rt := r.tables.Load().byName["payload"]; rt.sc == nil {
		t.Fatal("registered plain struct has no compiled codec")
	}
	if rt := r.tables.Load().byName["iface"]; rt.sc != nil {
		t.Fatal("struct with an interface field got a compiled codec")
	}
	msg := &scPayload{Payload: bytes.Repeat([]byte{1}, 64)}
	want, _ := appendMsgpack(nil, msg)
	name, ser, body, err := r.AppendEncode([]byte{9}, msg)
	if err != nil || name != "payload" || ser != SerMsgpack || !bytes.Equal(body, append([]byte{9}, want...)) {
		t.Fatalf("AppendEncode: %q %d %x %v", name, ser, body, err)
	}
	for _, m := range []any{msg, *msg} {
		if _, _, body, err = r.AppendEncode(nil, m); err != nil || !bytes.Equal(body, want) {
			t.Fatalf("Encode(%T): %x %v", m, body, err)
		}
	}
	got, err := r.Decode("payload", SerMsgpack, want)
	if err != nil || !reflect.DeepEqual(got, msg) {
		t.Fatalf("Decode: %+v %v", got, err)
	}
	// Unusual input goes to vmihailenco.
	odd := unhexBytes(t, "82 a75061796c6f6164 c0 a15a 01")
	got, err = r.Decode("payload", SerMsgpack, odd)
	if err != nil || !reflect.DeepEqual(got, &scPayload{}) {
		t.Fatalf("Decode unusual input: %+v %v", got, err)
	}
	if _, err = r.Decode("payload", SerMsgpack, unhexBytes(t, "81 a75061796c6f6164 c6ffffffff 00")); !errors.Is(err, ErrBadBody) || !strings.HasPrefix(err.Error(), `wire: decode "payload": `) {
		t.Fatalf("hostile body: %v", err)
	}
	if _, err = r.Decode("payload", SerMsgpack, unhexBytes(t, "81 a75061796c6f6164 01")); !errors.Is(err, ErrBadBody) {
		t.Fatalf("int for []byte: %v", err)
	}
	// The serializer on its own uses the same codecs.
	s := MsgpackSerializer{}
	if b, err := s.Marshal(msg); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("Marshal: %x %v", b, err)
	}
	if v, err := s.Unmarshal(want, reflect.TypeFor[scPayload]()); err != nil || !reflect.DeepEqual(v, msg) {
		t.Fatalf("Unmarshal: %+v %v", v, err)
	}
	// Values without a compiled codec keep vmihailenco's behaviour.
	for _, v := range []any{map[string]any{"a": 1}, 5, "s", nil, (*scPayload)(nil), scWithIface{X: 1}} {
		got, err := s.Marshal(v)
		want, err2 := appendMsgpack(nil, v)
		if err != nil || err2 != nil || !bytes.Equal(got, want) {
			t.Fatalf("Marshal(%#v): %x %v, want %x %v", v, got, err, want, err2)
		}
	}
}

func TestStructCodecAllocs(t *testing.T) {
	c := structCodecOf(scPayload{})
	msg := &scPayload{Payload: bytes.Repeat([]byte{0xab}, 64)}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf, _ = c.appendValue(buf[:0], msg) }); n != 0 {
		t.Errorf("encode into a buffer: %v allocations, want 0", n)
	}
	var boxed any = *msg
	if n := testing.AllocsPerRun(100, func() { buf, _ = c.appendValue(buf[:0], boxed) }); n != 0 {
		t.Errorf("encode a value into a buffer: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = c.unmarshal(buf) }); n > 2 {
		t.Errorf("decode: %v allocations, want at most 2 (the struct and the payload)", n)
	}
}

// scFuzzTypes are the types the fuzz targets exercise.
var scFuzzTypes = []reflect.Type{
	reflect.TypeFor[scAll](), reflect.TypeFor[scOmit](), reflect.TypeFor[scNode](), reflect.TypeFor[scTree](),
	reflect.TypeFor[scPayload](), reflect.TypeFor[scSingle](), reflect.TypeFor[scBig](),
}

func scFuzzSeeds(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, typ := range scFuzzTypes {
		for range 3 {
			raw := make([]byte, 64)
			for i := range raw {
				raw[i] = byte(rng.Uint32())
			}
			p := reflect.New(typ)
			(&scSource{b: raw}).fill(p.Elem(), 0)
			b, err := appendMsgpack(nil, p.Interface())
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, hb := range hostileBodies {
		f.Add(unhexBytes(f, hb.hex))
	}
}

// FuzzStructCodecDecode: any input decodes through the compiled codec
// exactly as through vmihailenco (same value or both an error), and the
// fast path never panics, even on unchecked input.
func FuzzStructCodecDecode(f *testing.F) {
	scFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range scFuzzTypes {
			checkDecode(t, typ, b)
		}
	})
}

// FuzzStructCodecRoundTrip: values built from the fuzz input encode to the
// bytes vmihailenco produces, and those bytes decode through the fast path
// to what vmihailenco decodes.
func FuzzStructCodecRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Add(bytes.Repeat([]byte{0x07, 0xc8, 0x31}, 100))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, typ := range scFuzzTypes {
			p := reflect.New(typ)
			(&scSource{b: raw}).fill(p.Elem(), 0)
			b := checkEncode(t, p)
			if !checkDecode(t, typ, b) {
				t.Fatalf("%v: fast path refused the encoder's own output %x", typ, b)
			}
		}
	})
}

func scBigSample() *scBig {
	return &scBig{
		Step: 12345, Name: "layer3.weight.grad", Shape: []int64{1024, 4096}, Values: []float32{0.5, -1.25, 3, 4.75},
		Labels: []string{"train", "shard-7"}, Weight: 0.001, Done: true,
		Meta:    scInner{A: 3, B: "meta", C: []uint16{1, 2, 3}},
		Parent:  &scNode{V: 1, Next: &scNode{V: 2}},
		Payload: bytes.Repeat([]byte{7}, 256),
	}
}

func benchStructCodecEncode(b *testing.B, msg any) {
	c := structCodecOf(msg)
	buf := make([]byte, 0, 4096)
	b.Run("compiled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = c.appendValue(buf[:0], msg)
		}
	})
	b.Run("vmihailenco", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = appendMsgpack(buf[:0], msg)
		}
	})
}

func benchStructCodecDecode(b *testing.B, msg any) {
	c := structCodecOf(msg)
	body, _ := appendMsgpack(nil, msg)
	typ := reflect.TypeOf(msg).Elem()
	b.Run("compiled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.unmarshal(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("vmihailenco", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := DecodeMsgpack(body, reflect.New(typ).Interface()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkStructCodecEncodePayload64(b *testing.B) {
	benchStructCodecEncode(b, &scPayload{Payload: bytes.Repeat([]byte{0xab}, 64)})
}

func BenchmarkStructCodecDecodePayload64(b *testing.B) {
	benchStructCodecDecode(b, &scPayload{Payload: bytes.Repeat([]byte{0xab}, 64)})
}

func BenchmarkStructCodecEncodeBig(b *testing.B) { benchStructCodecEncode(b, scBigSample()) }

func BenchmarkStructCodecDecodeBig(b *testing.B) { benchStructCodecDecode(b, scBigSample()) }
