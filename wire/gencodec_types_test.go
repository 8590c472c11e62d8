package wire

import "time"

// Message types with codecs written by tinylib/msgp's generator
// (gencodec_gen_test.go), compared with vmihailenco's reflection by the
// tests of gencodec_test.go. Slices, maps and byte slices are tagged
// allownil so that nil stays nil both ways, as vmihailenco encodes it.

//go:generate msgp -file gencodec_types_test.go -o gencodec_gen_test.go -io=false -tests=false -unexported

type gcName string

type gcSmall int16

type gcBlob []byte

type gcInner struct {
	A int8
	B string   `msgpack:"b,omitempty"`
	C []uint16 `msgpack:",omitempty,allownil"`
}

type gcAll struct {
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
	B       []byte `msgpack:",allownil"`
	Arr     [4]byte
	Bools   []bool    `msgpack:",allownil"`
	Ints    []int     `msgpack:",allownil"`
	I8s     []int8    `msgpack:",allownil"`
	I16s    []int16   `msgpack:",allownil"`
	I32s    []int32   `msgpack:",allownil"`
	I64s    []int64   `msgpack:",allownil"`
	Uints   []uint    `msgpack:",allownil"`
	U16s    []uint16  `msgpack:",allownil"`
	U32s    []uint32  `msgpack:",allownil"`
	U64s    []uint64  `msgpack:",allownil"`
	F32s    []float32 `msgpack:",allownil"`
	F64s    []float64 `msgpack:",allownil"`
	Strs    []string  `msgpack:",allownil"`
	Names   []gcName  `msgpack:",allownil"`
	Smalls  []gcSmall `msgpack:",allownil"`
	Named   gcName
	Small   gcSmall
	Blob    gcBlob `msgpack:",allownil"`
	D       time.Duration
	In      gcInner
	PIn     *gcInner
	Renamed int `msgpack:"r"`
	Skipped int `msgpack:"-"`
}

type gcOmit struct {
	Bool bool      `msgpack:",omitempty"`
	I    int       `msgpack:",omitempty"`
	I8   int8      `msgpack:",omitempty"`
	U64  uint64    `msgpack:",omitempty"`
	F64  float64   `msgpack:",omitempty"`
	S    string    `msgpack:"s,omitempty"`
	B    []byte    `msgpack:",omitempty,allownil"`
	Strs []string  `msgpack:",omitempty,allownil"`
	F64s []float64 `msgpack:",omitempty,allownil"`
	PIn  *gcInner  `msgpack:",omitempty"`
	Last int
}

type gcNode struct {
	V    int
	Next *gcNode
}

type gcPayload struct {
	Payload []byte `msgpack:",allownil"`
}

// gcTree nests through slices of structs and of pointers to structs.
type gcTree struct {
	Name  string
	Kids  []gcTree   `msgpack:",allownil"`
	Refs  []*gcInner `msgpack:",omitempty,allownil"`
	Nodes []*gcNode  `msgpack:",allownil"`
}

type gcMaps struct {
	M map[string]string  `msgpack:",allownil"`
	N map[string]int64   `msgpack:",allownil"`
	O map[string]gcInner `msgpack:",allownil"`
}

type gcEmpty struct{}

type gcBig struct {
	Step    int64
	Name    string
	Shape   []int64   `msgpack:",allownil"`
	Values  []float32 `msgpack:",allownil"`
	Labels  []string  `msgpack:",allownil"`
	Weight  float64
	Done    bool
	Meta    gcInner
	Parent  *gcNode
	Payload []byte `msgpack:",allownil"`
}
