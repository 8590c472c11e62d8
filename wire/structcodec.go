package wire

import (
	"encoding"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
)

// A structCodec is a msgpack codec compiled once for a plain struct type.
// It produces exactly the bytes of the msgpack encoder that appendMsgpack
// uses (vmihailenco/msgpack v5 with compact integers and sorted map keys:
// structs as maps of their exported fields in declaration order, floats in
// their own width, nil slices and pointers as nil) and decodes what that
// encoder writes, walking a precomputed field plan with unsafe pointer
// arithmetic instead of reflect.Value.
//
// Decoding has a fast path only: input it is not sure to decode exactly as
// vmihailenco would (an unknown or repeated key, an array-encoded struct,
// an unexpected type code) makes it give up, and the caller decodes the
// same bytes again from scratch with vmihailenco. Results are therefore
// always those of vmihailenco; the fast path merely avoids reflection for
// the encodings vmihailenco produces.
//
// A type is compiled when every field it encodes, at any depth, is a bool,
// an integer (not uintptr), a float, a string, a []byte, a [N]byte, a slice
// of those scalars or of strings, or a struct value, a pointer to a struct,
// a slice of structs or a slice of pointers to structs whose struct is
// itself compilable, and when no such type (nor its pointer)
// implements msgpack.CustomEncoder, CustomDecoder, Marshaler, Unmarshaler,
// encoding.BinaryMarshaler, BinaryUnmarshaler, TextMarshaler,
// TextUnmarshaler or IsZero() bool. Struct tags may name a field, skip it
// ("-") and set omitempty; any other tag option, embedded fields, a
// _msgpack field or two fields encoded under one name keep the type on
// vmihailenco. Named types of the supported kinds are fine. Compiling ends
// with a probe (a zero and a filled value, encoded and decoded both ways);
// it notices an encoder registered for a plain type with msgpack.Register
// or RegisterExtEncoder, but only one registered before the type is
// compiled (at Registry registration or first use).
type structCodec struct {
	typ    reflect.Type
	fields []scField
	omit   bool // some field is omitempty

	// Interface type words of *typ and typ, and whether a typ stored in an
	// interface is the data word itself (pointer-shaped types).
	ptrType, valType unsafe.Pointer
	direct           bool
}

// scKind is how one field (or slice element) is encoded.
type scKind uint8

const (
	scBool scKind = iota + 1
	scInt
	scInt8
	scInt16
	scInt32
	scInt64
	scUint
	scUint8
	scUint16
	scUint32
	scUint64
	scFloat32
	scFloat64
	scString
	scBytes     // a slice of a uint8 kind: msgpack bin
	scByteArray // [n] of a uint8 kind: msgpack bin of n bytes
	scSlice     // a slice of a scalar or string kind (elem): msgpack array
	scStruct    // a struct value (sub)
	scPtrStruct // a pointer to a struct (sub)
	// A slice of struct values (sub; styp is the slice type): msgpack array
	// of maps.
	scSliceStruct
	// A slice of pointers to structs (sub; styp is the slice type).
	scSlicePtrStruct
)

// scField is one encoded field of a compiled struct.
type scField struct {
	name string
	key  []byte // the msgpack encoding of name
	off  uintptr
	kind scKind
	elem scKind // element kind of scSlice
	n    int    // length of scByteArray
	omit bool   // omitempty
	sub  *structCodec
	styp reflect.Type // slice type of scSliceStruct and scSlicePtrStruct
}

// scMaxFields bounds the fields of a compiled struct: the decoder tracks
// the keys it has seen in a uint64.
const scMaxFields = 64

// scMaxEncodeDepth is the nesting of struct values and pointers at which
// the compiled encoder hands the value to vmihailenco instead (which gives
// the same bytes): a receiver rejects bodies nested deeper than
// MaxMsgpackDepth anyway, and a pointer cycle must behave as before.
const scMaxEncodeDepth = 2 * MaxMsgpackDepth

var (
	scCustomTypes = []reflect.Type{
		reflect.TypeFor[msgpack.CustomEncoder](),
		reflect.TypeFor[msgpack.CustomDecoder](),
		reflect.TypeFor[msgpack.Marshaler](),
		reflect.TypeFor[msgpack.Unmarshaler](),
		reflect.TypeFor[encoding.BinaryMarshaler](),
		reflect.TypeFor[encoding.BinaryUnmarshaler](),
		reflect.TypeFor[encoding.TextMarshaler](),
		reflect.TypeFor[encoding.TextUnmarshaler](),
		reflect.TypeFor[interface{ IsZero() bool }](), // changes omitempty
	}
	scKinds = map[reflect.Kind]scKind{
		reflect.Bool: scBool, reflect.Int: scInt, reflect.Int8: scInt8,
		reflect.Int16: scInt16, reflect.Int32: scInt32, reflect.Int64: scInt64,
		reflect.Uint: scUint, reflect.Uint8: scUint8, reflect.Uint16: scUint16,
		reflect.Uint32: scUint32, reflect.Uint64: scUint64,
		reflect.Float32: scFloat32, reflect.Float64: scFloat64,
		reflect.String: scString,
	}
	// scCache holds the compiled codec (or scNone) of each struct type
	// asked for.
	scCache sync.Map // reflect.Type → *structCodec
	scNone  = &structCodec{}
)

// structCodecFor returns the compiled codec of the struct type typ, or nil
// when typ is not a struct or cannot be compiled. Answers are cached.
func structCodecFor(typ reflect.Type) *structCodec {
	if typ == nil || typ.Kind() != reflect.Struct {
		return nil
	}
	if c, ok := scCache.Load(typ); ok {
		if c == scNone {
			return nil
		}
		return c.(*structCodec)
	}
	c := compileStructCodec(typ)
	if c == nil {
		scCache.Store(typ, scNone)
		return nil
	}
	actual, _ := scCache.LoadOrStore(typ, c)
	return actual.(*structCodec)
}

// structCodecOf returns the compiled codec of v's type (v a struct or a
// pointer to one), or nil.
func structCodecOf(v any) *structCodec {
	typ := reflect.TypeOf(v)
	if typ == nil {
		return nil
	}
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return structCodecFor(typ)
}

// compileStructCodec compiles typ, or returns nil if any part of it is
// unsupported or if the compiled codec disagrees with vmihailenco on probe
// values (which catches encoders registered with msgpack.Register or
// RegisterExtEncoder for a plain type).
func compileStructCodec(typ reflect.Type) *structCodec {
	if unsafe.Sizeof(int(0)) != 8 {
		return nil // the plans below assume 64-bit int and uint
	}
	c := compileStruct(typ, map[reflect.Type]*structCodec{})
	if c == nil || !c.setTypeWords() || !probeStructCodec(c) {
		return nil
	}
	return c
}

// compileStruct compiles the struct type t; seen holds the structs being
// compiled (a pointer may lead back to one of them).
func compileStruct(t reflect.Type, seen map[reflect.Type]*structCodec) *structCodec {
	if c, ok := seen[t]; ok {
		return c
	}
	if hasCustomCoding(t) {
		return nil
	}
	c := &structCodec{typ: t}
	seen[t] = c
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, omit, ok := parseMsgpackTag(f.Tag.Get("msgpack"))
		if !ok {
			return nil
		}
		if name == "-" {
			continue
		}
		if f.Name == "_msgpack" || f.Anonymous {
			return nil // as_array/omitempty for the whole struct, inlining
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if names[name] {
			return nil
		}
		names[name] = true
		fld, ok := compileField(f.Type, seen)
		if !ok {
			return nil
		}
		fld.name = name
		fld.key = appendStrLen(nil, len(name))
		fld.key = append(fld.key, name...)
		fld.off = f.Offset
		fld.omit = omit
		c.fields = append(c.fields, fld)
		c.omit = c.omit || omit
	}
	if len(c.fields) > scMaxFields {
		return nil
	}
	return c
}

// compileField returns the plan of a field of type t.
func compileField(t reflect.Type, seen map[reflect.Type]*structCodec) (scField, bool) {
	if hasCustomCoding(t) {
		return scField{}, false
	}
	if k, ok := scKinds[t.Kind()]; ok {
		return scField{kind: k}, true
	}
	switch t.Kind() {
	case reflect.Slice:
		e := t.Elem()
		if hasCustomCoding(e) {
			return scField{}, false
		}
		if e.Kind() == reflect.Uint8 {
			return scField{kind: scBytes}, true
		}
		if k, ok := scKinds[e.Kind()]; ok {
			return scField{kind: scSlice, elem: k}, true
		}
		if e.Kind() == reflect.Struct {
			if sub := compileStruct(e, seen); sub != nil {
				return scField{kind: scSliceStruct, sub: sub, styp: t}, true
			}
		}
		if e.Kind() == reflect.Pointer && e.Elem().Kind() == reflect.Struct {
			if sub := compileStruct(e.Elem(), seen); sub != nil {
				return scField{kind: scSlicePtrStruct, sub: sub, styp: t}, true
			}
		}
	case reflect.Array:
		if e := t.Elem(); e.Kind() == reflect.Uint8 && !hasCustomCoding(e) {
			return scField{kind: scByteArray, n: t.Len()}, true
		}
	case reflect.Struct:
		if sub := compileStruct(t, seen); sub != nil {
			return scField{kind: scStruct, sub: sub}, true
		}
	case reflect.Pointer:
		if e := t.Elem(); e.Kind() == reflect.Struct {
			if sub := compileStruct(e, seen); sub != nil {
				return scField{kind: scPtrStruct, sub: sub}, true
			}
		}
	}
	return scField{}, false
}

// hasCustomCoding reports whether t or *t implements an interface that
// vmihailenco honours instead of encoding the value by its kind.
func hasCustomCoding(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	for _, it := range scCustomTypes {
		if t.Implements(it) || pt.Implements(it) {
			return true
		}
	}
	return false
}

// parseMsgpackTag parses a msgpack struct tag: a name, then options. ok is
// false for anything but a plain name and omitempty (the tag syntax of
// vmihailenco's tagparser has quoting, key:value options and spaces, and
// options such as intern, inline or alias change the encoding).
func parseMsgpackTag(tag string) (name string, omit, ok bool) {
	if strings.ContainsAny(tag, ":'\\() \t\r\n\v\f") {
		return "", false, false
	}
	name, opts, hasOpts := strings.Cut(tag, ",")
	if name == "-" {
		return name, false, true
	}
	if hasOpts {
		for opt := range strings.SplitSeq(opts, ",") {
			if opt != "omitempty" {
				return "", false, false
			}
			omit = true
		}
	}
	return name, omit, true
}

// scSentinel is a pointer that setTypeWords stores in a probe value.
var scSentinel byte

// setTypeWords records the interface type words of *c.typ and c.typ, and
// whether a c.typ is stored directly in an interface's data word. It
// returns false if that cannot be determined.
func (c *structCodec) setTypeWords() bool {
	pv := reflect.New(c.typ)
	pi := pv.Interface()
	c.ptrType = (*efaceWords)(unsafe.Pointer(&pi)).typ
	shaped := pointerShaped(c.typ)
	if shaped {
		*(*unsafe.Pointer)(pv.UnsafePointer()) = unsafe.Pointer(&scSentinel)
	}
	vi := pv.Elem().Interface()
	w := (*efaceWords)(unsafe.Pointer(&vi))
	c.valType = w.typ
	c.direct = w.data == unsafe.Pointer(&scSentinel)
	if shaped {
		*(*unsafe.Pointer)(pv.UnsafePointer()) = nil
	}
	return c.direct == shaped
}

// pointerShaped reports whether t is represented by one pointer (and
// therefore stored directly in an interface's data word).
func pointerShaped(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Struct:
		return t.NumField() == 1 && pointerShaped(t.Field(0).Type)
	case reflect.Array:
		return t.Len() == 1 && pointerShaped(t.Elem())
	}
	return false
}

// efaceWords is the layout of an interface value (any).
type efaceWords struct {
	typ  unsafe.Pointer
	data unsafe.Pointer
}

// probeStructCodec encodes a zero value and a filled sample of c.typ with
// both codecs and decodes the results with both, and reports whether
// everything agrees.
func probeStructCodec(c *structCodec) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false // a registered custom encoder panicked: not ours
		}
	}()
	for _, fill := range []bool{false, true} {
		v := reflect.New(c.typ)
		if fill {
			fillProbe(v.Elem(), 0)
		}
		want, err := appendMsgpack(nil, v.Interface())
		if err != nil {
			return false
		}
		got, ok := c.appendValue(nil, v.Interface())
		if !ok || string(got) != string(want) {
			return false
		}
		got, ok = c.appendValue(nil, v.Elem().Interface())
		if !ok || string(got) != string(want) {
			return false
		}
		fast := reflect.New(c.typ)
		if !c.decodeFast(want, fast.UnsafePointer()) {
			return false
		}
		slow := reflect.New(c.typ)
		if err := decodeMsgpackChecked(want, slow.Interface()); err != nil {
			return false
		}
		if !reflect.DeepEqual(fast.Interface(), slow.Interface()) {
			return false
		}
	}
	return true
}

// fillProbe sets every exported field of the struct v to a non-zero value
// (pointers up to a small depth).
func fillProbe(v reflect.Value, depth int) {
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			f.SetInt(-3)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(200)
		case reflect.Float32, reflect.Float64:
			f.SetFloat(1.5)
		case reflect.String:
			f.SetString("probe")
		case reflect.Slice:
			if k := f.Type().Elem().Kind(); (k == reflect.Struct || k == reflect.Pointer) && depth >= 3 {
				continue // a type may hold slices of itself
			}
			s := reflect.MakeSlice(f.Type(), 2, 2)
			for j := range 2 {
				switch e := s.Index(j); e.Kind() {
				case reflect.Struct:
					fillProbe(e, depth+1)
				case reflect.Pointer:
					if depth < 3 {
						p := reflect.New(e.Type().Elem())
						fillProbe(p.Elem(), depth+1)
						e.Set(p)
					}
				default:
					fillScalar(e)
				}
			}
			f.Set(s)
		case reflect.Array:
			for j := range f.Len() {
				fillScalar(f.Index(j))
			}
		case reflect.Struct:
			fillProbe(f, depth+1)
		case reflect.Pointer:
			if depth < 3 {
				p := reflect.New(f.Type().Elem())
				fillProbe(p.Elem(), depth+1)
				f.Set(p)
			}
		}
	}
}

// fillScalar sets the scalar or string v to a non-zero value.
func fillScalar(v reflect.Value) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(9)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(-2.25)
	case reflect.String:
		v.SetString("s")
	}
}

// ---- encoding ----

// appendValue appends the encoding of v (a c.typ or a non-nil *c.typ) to
// dst. ok is false, and dst unchanged, when v is anything else or nests
// deeper than scMaxEncodeDepth: the caller encodes it with vmihailenco.
func (c *structCodec) appendValue(dst []byte, v any) (out []byte, ok bool) {
	w := (*efaceWords)(unsafe.Pointer(&v))
	var p unsafe.Pointer
	switch {
	case w.typ == c.ptrType && w.data != nil:
		p = w.data
	case w.typ == c.valType && c.direct:
		p = unsafe.Pointer(&w.data)
	case w.typ == c.valType:
		p = w.data
	default:
		return dst, false
	}
	if dst == nil {
		dst = make([]byte, 0, 128)
	}
	out, ok = c.appendStruct(dst, p, 0)
	if !ok {
		return dst, false
	}
	return out, true
}

// appendStruct appends the msgpack map of the struct at p.
func (c *structCodec) appendStruct(dst []byte, p unsafe.Pointer, depth int) ([]byte, bool) {
	if depth > scMaxEncodeDepth {
		return dst, false
	}
	n := len(c.fields)
	if c.omit {
		for i := range c.fields {
			if f := &c.fields[i]; f.omit && f.isEmpty(unsafe.Add(p, f.off)) {
				n--
			}
		}
	}
	dst = appendMapLen(dst, n)
	for i := range c.fields {
		f := &c.fields[i]
		fp := unsafe.Add(p, f.off)
		if f.omit && f.isEmpty(fp) {
			continue
		}
		dst = append(dst, f.key...)
		var ok bool
		if dst, ok = f.appendField(dst, fp, depth); !ok {
			return dst, false
		}
	}
	return dst, true
}

// appendField appends the value of field f at fp.
func (f *scField) appendField(dst []byte, fp unsafe.Pointer, depth int) ([]byte, bool) {
	switch f.kind {
	case scBytes:
		b := *(*[]byte)(fp)
		if b == nil {
			return append(dst, 0xc0), true
		}
		dst = appendBinLen(dst, len(b))
		return append(dst, b...), true
	case scByteArray:
		dst = appendBinLen(dst, f.n)
		return append(dst, unsafe.Slice((*byte)(fp), f.n)...), true
	case scSlice:
		return appendSlice(dst, f.elem, fp), true
	case scStruct:
		return f.sub.appendStruct(dst, fp, depth+1)
	case scPtrStruct:
		sp := *(*unsafe.Pointer)(fp)
		if sp == nil {
			return append(dst, 0xc0), true
		}
		return f.sub.appendStruct(dst, sp, depth+1)
	case scSliceStruct, scSlicePtrStruct:
		return f.appendStructSlice(dst, fp, depth)
	}
	return appendScalar(dst, f.kind, fp), true
}

// appendStructSlice appends the slice of structs or of pointers to structs
// at fp as an array.
func (f *scField) appendStructSlice(dst []byte, fp unsafe.Pointer, depth int) ([]byte, bool) {
	h := *(*[]byte)(fp) // the header's layout, whatever the element type
	if h == nil {
		return append(dst, 0xc0), true
	}
	n := len(h)
	dst = appendArrayLen(dst, n)
	if n == 0 {
		return dst, true
	}
	base := unsafe.Pointer(unsafe.SliceData(h))
	var ok bool
	if f.kind == scSliceStruct {
		size := f.sub.typ.Size()
		for i := range n {
			if dst, ok = f.sub.appendStruct(dst, unsafe.Add(base, uintptr(i)*size), depth+1); !ok {
				return dst, false
			}
		}
		return dst, true
	}
	for i := range n {
		sp := *(*unsafe.Pointer)(unsafe.Add(base, uintptr(i)*unsafe.Sizeof(base)))
		if sp == nil {
			dst = append(dst, 0xc0)
			continue
		}
		if dst, ok = f.sub.appendStruct(dst, sp, depth+1); !ok {
			return dst, false
		}
	}
	return dst, true
}

// appendScalar appends the scalar or string of kind k at p.
func appendScalar(dst []byte, k scKind, p unsafe.Pointer) []byte {
	switch k {
	case scBool:
		if *(*bool)(p) {
			return append(dst, 0xc3)
		}
		return append(dst, 0xc2)
	case scInt:
		return appendInt(dst, int64(*(*int)(p)))
	case scInt8:
		return appendInt(dst, int64(*(*int8)(p)))
	case scInt16:
		return appendInt(dst, int64(*(*int16)(p)))
	case scInt32:
		return appendInt(dst, int64(*(*int32)(p)))
	case scInt64:
		return appendInt(dst, *(*int64)(p))
	case scUint:
		return appendUint(dst, uint64(*(*uint)(p)))
	case scUint8:
		return appendUint(dst, uint64(*(*uint8)(p)))
	case scUint16:
		return appendUint(dst, uint64(*(*uint16)(p)))
	case scUint32:
		return appendUint(dst, uint64(*(*uint32)(p)))
	case scUint64:
		return appendUint(dst, *(*uint64)(p))
	case scFloat32:
		dst = append(dst, 0xca)
		return binary.BigEndian.AppendUint32(dst, math.Float32bits(*(*float32)(p)))
	case scFloat64:
		dst = append(dst, 0xcb)
		return binary.BigEndian.AppendUint64(dst, math.Float64bits(*(*float64)(p)))
	case scString:
		s := *(*string)(p)
		dst = appendStrLen(dst, len(s))
		return append(dst, s...)
	}
	return dst // unreachable: compileField makes no other kind
}

// appendSlice appends the slice of elements of kind k at p as an array.
func appendSlice(dst []byte, k scKind, p unsafe.Pointer) []byte {
	// Every slice header has the same layout; the element type only
	// decides the stride.
	h := *(*[]byte)(p)
	if h == nil {
		return append(dst, 0xc0)
	}
	n := len(h)
	dst = appendArrayLen(dst, n)
	if n == 0 {
		return dst
	}
	base, size := unsafe.Pointer(unsafe.SliceData(h)), scSize(k)
	for i := range n {
		dst = appendScalar(dst, k, unsafe.Add(base, uintptr(i)*size))
	}
	return dst
}

// scSize is the size in memory of a scalar or string of kind k.
func scSize(k scKind) uintptr {
	switch k {
	case scBool, scInt8, scUint8:
		return 1
	case scInt16, scUint16:
		return 2
	case scInt32, scUint32, scFloat32:
		return 4
	case scInt64, scUint64, scFloat64:
		return 8
	case scInt, scUint:
		return unsafe.Sizeof(int(0))
	}
	return unsafe.Sizeof("") // scString
}

// isEmpty reports whether the field at fp is empty in vmihailenco's
// omitempty sense.
func (f *scField) isEmpty(fp unsafe.Pointer) bool {
	switch f.kind {
	case scBool:
		return !*(*bool)(fp)
	case scInt, scInt64, scUint, scUint64:
		return *(*uint64)(fp) == 0
	case scInt8, scUint8:
		return *(*uint8)(fp) == 0
	case scInt16, scUint16:
		return *(*uint16)(fp) == 0
	case scInt32, scUint32:
		return *(*uint32)(fp) == 0
	case scFloat32:
		return *(*float32)(fp) == 0
	case scFloat64:
		return *(*float64)(fp) == 0
	case scString:
		return len(*(*string)(fp)) == 0
	case scBytes, scSlice, scSliceStruct, scSlicePtrStruct:
		return len(*(*[]byte)(fp)) == 0
	case scByteArray:
		return f.n == 0
	case scStruct:
		for i := range f.sub.fields {
			sf := &f.sub.fields[i]
			if !sf.omit || !sf.isEmpty(unsafe.Add(fp, sf.off)) {
				return false
			}
		}
		return true
	case scPtrStruct:
		return *(*unsafe.Pointer)(fp) == nil
	}
	return false
}

func appendUint(dst []byte, n uint64) []byte {
	switch {
	case n <= math.MaxInt8:
		return append(dst, byte(n))
	case n <= math.MaxUint8:
		return append(dst, 0xcc, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(n))
	case n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), n)
}

func appendInt(dst []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(dst, uint64(n))
	case n >= -32:
		return append(dst, byte(n))
	case n >= math.MinInt8:
		return append(dst, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(n))
}

func appendStrLen(dst []byte, n int) []byte {
	switch {
	case n < 32:
		return append(dst, 0xa0|byte(n))
	case n < 256:
		return append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
}

func appendBinLen(dst []byte, n int) []byte {
	switch {
	case n < 256:
		return append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

// ---- decoding ----

// unmarshal validates b (as DecodeMsgpack does) and decodes it into a new
// c.typ, returning a pointer to it. The fast path handles what the encoder
// produces; anything else is decoded from scratch by vmihailenco, so the
// result is always vmihailenco's.
func (c *structCodec) unmarshal(b []byte) (any, error) {
	if err := checkMsgpack(b, MaxMsgpackDepth); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	p := reflect.New(c.typ)
	if c.decodeFast(b, p.UnsafePointer()) {
		return p.Interface(), nil
	}
	p = reflect.New(c.typ)
	v := p.Interface()
	if err := decodeMsgpackChecked(b, v); err != nil {
		return nil, err
	}
	return v, nil
}

// decodeFast decodes b, one msgpack value, into the zero c.typ at p. It
// returns false, leaving p partly written, for anything it is not sure to
// decode exactly as vmihailenco would. It never panics and never reads
// outside b; decoded strings and slices do not alias b.
func (c *structCodec) decodeFast(b []byte, p unsafe.Pointer) bool {
	r := scReader{b: b}
	return c.decodeStruct(&r, p, 0) && r.i == len(b)
}

// scReader reads msgpack from b at i.
type scReader struct {
	b []byte
	i int
}

// next returns the next byte.
func (r *scReader) next() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	c := r.b[r.i]
	r.i++
	return c, true
}

// take returns the next n bytes (a view of b).
func (r *scReader) take(n int) ([]byte, bool) {
	if n < 0 || n > len(r.b)-r.i {
		return nil, false
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, true
}

// length reads an n-byte big-endian length.
func (r *scReader) length(n int) (int, bool) {
	s, ok := r.take(n)
	if !ok {
		return 0, false
	}
	switch n {
	case 1:
		return int(s[0]), true
	case 2:
		return int(binary.BigEndian.Uint16(s)), true
	}
	return int(binary.BigEndian.Uint32(s)), true
}

// remaining is the number of unread bytes.
func (r *scReader) remaining() int { return len(r.b) - r.i }

// arrayHeader reads an array header, or nil (isNil). A count larger than
// the bytes that remain is refused (each element takes at least one byte),
// so no caller allocates from it beyond the input's size.
func (r *scReader) arrayHeader() (n int, isNil, ok bool) {
	code, ok := r.next()
	if !ok {
		return 0, false, false
	}
	switch {
	case code == 0xc0:
		return 0, true, true
	case code >= 0x90 && code <= 0x9f:
		n = int(code & 0x0f)
	case code == 0xdc:
		n, ok = r.length(2)
	case code == 0xdd:
		n, ok = r.length(4)
	default:
		return 0, false, false
	}
	return n, false, ok && n <= r.remaining()
}

// decodeStruct decodes a map (or nil) into the zero struct at p. depth is
// 0 for the outermost struct; a struct at depth d is a map at checkMsgpack's
// nesting level d+1 and its slices are at d+2, so the limit keeps the fast
// path within what checkMsgpack accepts.
func (c *structCodec) decodeStruct(r *scReader, p unsafe.Pointer, depth int) bool {
	if depth > MaxMsgpackDepth-2 {
		return false
	}
	code, ok := r.next()
	if !ok {
		return false
	}
	var n int
	switch {
	case code == 0xc0:
		return true // a nil struct is the zero value, which p already is
	case code >= 0x80 && code <= 0x8f:
		n = int(code & 0x0f)
	case code == 0xde:
		n, ok = r.length(2)
	case code == 0xdf:
		n, ok = r.length(4)
	default:
		return false // an array-encoded struct or a type error
	}
	if !ok || n > r.remaining()/2 {
		return false
	}
	var seen uint64
	hint := 0
	for range n {
		key, ok := r.key()
		if !ok {
			return false
		}
		idx := c.field(key, hint)
		if idx < 0 || seen&(1<<idx) != 0 {
			return false // unknown or repeated: vmihailenco skips or merges
		}
		seen |= 1 << idx
		hint = idx + 1
		f := &c.fields[idx]
		if !f.decodeField(r, unsafe.Add(p, f.off), depth) {
			return false
		}
	}
	return true
}

// key reads a map key, which must be a str.
func (r *scReader) key() ([]byte, bool) {
	code, ok := r.next()
	if !ok {
		return nil, false
	}
	var n int
	switch {
	case code >= 0xa0 && code <= 0xbf:
		n = int(code & 0x1f)
	case code == 0xd9:
		n, ok = r.length(1)
	case code == 0xda:
		n, ok = r.length(2)
	case code == 0xdb:
		n, ok = r.length(4)
	default:
		return nil, false
	}
	if !ok {
		return nil, false
	}
	return r.take(n)
}

// field returns the index of the field named key, trying hint (the field
// after the previous key) first, or -1.
func (c *structCodec) field(key []byte, hint int) int {
	if hint < len(c.fields) && c.fields[hint].name == string(key) {
		return hint
	}
	for i := range c.fields {
		if c.fields[i].name == string(key) {
			return i
		}
	}
	return -1
}

// decodeField decodes the value of field f into fp.
func (f *scField) decodeField(r *scReader, fp unsafe.Pointer, depth int) bool {
	switch f.kind {
	case scBytes:
		b, isNil, ok := r.bin()
		if !ok {
			return false
		}
		if !isNil {
			*(*[]byte)(fp) = append(make([]byte, 0, len(b)), b...)
		}
		return true
	case scByteArray:
		b, _, ok := r.bin()
		if !ok || len(b) > f.n {
			return false
		}
		copy(unsafe.Slice((*byte)(fp), f.n), b)
		return true
	case scSlice:
		return decodeSlice(r, f.elem, fp)
	case scStruct:
		return f.sub.decodeStruct(r, fp, depth+1)
	case scPtrStruct:
		if r.i < len(r.b) && r.b[r.i] == 0xc0 {
			r.i++
			return true // nil: the pointer stays nil
		}
		sp := reflect.New(f.sub.typ).UnsafePointer()
		if !f.sub.decodeStruct(r, sp, depth+1) {
			return false
		}
		*(*unsafe.Pointer)(fp) = sp
		return true
	case scSliceStruct, scSlicePtrStruct:
		return f.decodeStructSlice(r, fp, depth)
	}
	return r.scalar(f.kind, fp)
}

// decodeStructSlice decodes an array (or nil) of maps (or nils) into the
// nil slice of structs or of pointers to structs at fp. The elements are a
// nesting level below the array, two below the struct holding fp.
func (f *scField) decodeStructSlice(r *scReader, fp unsafe.Pointer, depth int) bool {
	n, isNil, ok := r.arrayHeader()
	if !ok || isNil {
		return ok // nil: the slice stays nil
	}
	base := reflect.MakeSlice(f.styp, n, n).UnsafePointer()
	// The header of a []T is {base, n, n} whatever T is.
	*(*[]byte)(fp) = unsafe.Slice((*byte)(base), n)
	if f.kind == scSliceStruct {
		size := f.sub.typ.Size()
		for i := range n {
			if !f.sub.decodeStruct(r, unsafe.Add(base, uintptr(i)*size), depth+2) {
				return false
			}
		}
		return true
	}
	for i := range n {
		if r.i < len(r.b) && r.b[r.i] == 0xc0 {
			r.i++
			continue // nil: the pointer stays nil
		}
		sp := reflect.New(f.sub.typ).UnsafePointer()
		if !f.sub.decodeStruct(r, sp, depth+2) {
			return false
		}
		*(*unsafe.Pointer)(unsafe.Add(base, uintptr(i)*unsafe.Sizeof(base))) = sp
	}
	return true
}

// bin reads a bin or str (or nil) as vmihailenco's bytes decoding accepts
// them and returns a view of its bytes.
func (r *scReader) bin() (b []byte, isNil, ok bool) {
	code, ok := r.next()
	if !ok {
		return nil, false, false
	}
	var n int
	switch {
	case code == 0xc0:
		return nil, true, true
	case code >= 0xa0 && code <= 0xbf:
		n = int(code & 0x1f)
	case code == 0xc4, code == 0xd9:
		n, ok = r.length(1)
	case code == 0xc5, code == 0xda:
		n, ok = r.length(2)
	case code == 0xc6, code == 0xdb:
		n, ok = r.length(4)
	default:
		return nil, false, false
	}
	if !ok {
		return nil, false, false
	}
	b, ok = r.take(n)
	return b, false, ok
}

// int reads any integer (or nil, as 0) as vmihailenco's DecodeInt64 does.
// DecodeUint64 gives the same bits.
func (r *scReader) int() (int64, bool) {
	code, ok := r.next()
	if !ok {
		return 0, false
	}
	return r.intCode(code)
}

func (r *scReader) intCode(code byte) (int64, bool) {
	if code <= 0x7f || code >= 0xe0 {
		return int64(int8(code)), true
	}
	var s []byte
	var ok bool
	switch code {
	case 0xc0:
		return 0, true
	case 0xcc, 0xd0:
		s, ok = r.take(1)
		if !ok {
			return 0, false
		}
		if code == 0xcc {
			return int64(s[0]), true
		}
		return int64(int8(s[0])), true
	case 0xcd, 0xd1:
		s, ok = r.take(2)
		if !ok {
			return 0, false
		}
		u := binary.BigEndian.Uint16(s)
		if code == 0xcd {
			return int64(u), true
		}
		return int64(int16(u)), true
	case 0xce, 0xd2:
		s, ok = r.take(4)
		if !ok {
			return 0, false
		}
		u := binary.BigEndian.Uint32(s)
		if code == 0xce {
			return int64(u), true
		}
		return int64(int32(u)), true
	case 0xcf, 0xd3:
		s, ok = r.take(8)
		if !ok {
			return 0, false
		}
		return int64(binary.BigEndian.Uint64(s)), true
	}
	return 0, false
}

// scalar decodes one scalar or string of kind k into p, accepting what
// vmihailenco's decoder for that kind accepts (integers of any width,
// truncated to the field; nil as the zero value; integers for floats).
func (r *scReader) scalar(k scKind, p unsafe.Pointer) bool {
	switch k {
	case scBool:
		code, ok := r.next()
		switch {
		case !ok:
			return false
		case code == 0xc3:
			*(*bool)(p) = true
		case code == 0xc2, code == 0xc0:
			*(*bool)(p) = false
		default:
			return false
		}
		return true
	case scFloat32, scFloat64:
		return r.float(k, p)
	case scString:
		b, _, ok := r.bin()
		if ok {
			*(*string)(p) = string(b)
		}
		return ok
	}
	n, ok := r.int()
	if !ok {
		return false
	}
	switch k {
	case scInt:
		*(*int)(p) = int(n)
	case scInt8:
		*(*int8)(p) = int8(n)
	case scInt16:
		*(*int16)(p) = int16(n)
	case scInt32:
		*(*int32)(p) = int32(n)
	case scInt64:
		*(*int64)(p) = n
	case scUint:
		*(*uint)(p) = uint(n)
	case scUint8:
		*(*uint8)(p) = uint8(n)
	case scUint16:
		*(*uint16)(p) = uint16(n)
	case scUint32:
		*(*uint32)(p) = uint32(n)
	case scUint64:
		*(*uint64)(p) = uint64(n)
	default:
		return false
	}
	return true
}

// float decodes a float32 or float64 (kind k) into p.
func (r *scReader) float(k scKind, p unsafe.Pointer) bool {
	code, ok := r.next()
	if !ok {
		return false
	}
	switch code {
	case 0xca:
		s, ok := r.take(4)
		if !ok {
			return false
		}
		f := math.Float32frombits(binary.BigEndian.Uint32(s))
		if k == scFloat32 {
			*(*float32)(p) = f
		} else {
			*(*float64)(p) = float64(f)
		}
		return true
	case 0xcb:
		if k == scFloat32 {
			return false // vmihailenco refuses a float64 for a float32
		}
		s, ok := r.take(8)
		if !ok {
			return false
		}
		*(*float64)(p) = math.Float64frombits(binary.BigEndian.Uint64(s))
		return true
	}
	n, ok := r.intCode(code)
	if !ok {
		return false
	}
	if k == scFloat32 {
		*(*float32)(p) = float32(n)
	} else {
		*(*float64)(p) = float64(n)
	}
	return true
}

// decodeSlice decodes an array (or nil) of elements of kind k into the nil
// slice at p. An empty array gives an empty, non-nil slice, as in
// vmihailenco.
func decodeSlice(r *scReader, k scKind, p unsafe.Pointer) bool {
	n, isNil, ok := r.arrayHeader()
	if !ok || isNil {
		return ok // nil: the slice stays nil
	}
	base, size, ok := makeScalarSlice(k, n, p)
	if !ok {
		return false
	}
	for i := range n {
		if !r.scalar(k, unsafe.Add(base, uintptr(i)*size)) {
			return false
		}
	}
	return true
}

// makeScalarSlice stores a new slice of n elements of kind k at p (whose
// element type has kind k, so the layouts match) and returns its first
// element and the element size.
func makeScalarSlice(k scKind, n int, p unsafe.Pointer) (unsafe.Pointer, uintptr, bool) {
	switch k {
	case scBool:
		s := make([]bool, n)
		*(*[]bool)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 1, true
	case scInt8, scUint8:
		s := make([]uint8, n)
		*(*[]uint8)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 1, true
	case scInt16, scUint16:
		s := make([]uint16, n)
		*(*[]uint16)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 2, true
	case scInt32, scUint32:
		s := make([]uint32, n)
		*(*[]uint32)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 4, true
	case scFloat32:
		s := make([]float32, n)
		*(*[]float32)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 4, true
	case scInt, scInt64, scUint, scUint64:
		s := make([]uint64, n)
		*(*[]uint64)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 8, true
	case scFloat64:
		s := make([]float64, n)
		*(*[]float64)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), 8, true
	case scString:
		s := make([]string, n)
		*(*[]string)(p) = s
		return unsafe.Pointer(unsafe.SliceData(s)), unsafe.Sizeof(""), true
	}
	return nil, 0, false // unreachable: compileField makes no other kind
}
