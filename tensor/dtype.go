package tensor

import (
	"fmt"
	"strconv"
)

// DType is the element type of a tensor.
type DType uint8

// The element types. The zero value is invalid so that a forgotten dtype is
// caught.
const (
	Invalid DType = iota
	Float32
	Float16
	BFloat16
	Float64
	Int8
	Int16
	Int32
	Int64
	Uint8
	Bool
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	name string
	size int
}{
	Invalid:  {"invalid", 0},
	Float32:  {"float32", 4},
	Float16:  {"float16", 2},
	BFloat16: {"bfloat16", 2},
	Float64:  {"float64", 8},
	Int8:     {"int8", 1},
	Int16:    {"int16", 2},
	Int32:    {"int32", 4},
	Int64:    {"int64", 8},
	Uint8:    {"uint8", 1},
	Bool:     {"bool", 1},
}

// AllDTypes lists every valid dtype.
func AllDTypes() []DType {
	out := make([]DType, 0, numDTypes-1)
	for d := Float32; d < numDTypes; d++ {
		out = append(out, d)
	}
	return out
}

// Valid reports whether d is a known dtype.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// Size is the size of one element in bytes (0 for an invalid dtype).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String returns the dtype's name, e.g. "float32".
func (d DType) String() string {
	if d < numDTypes {
		return dtypeInfo[d].name
	}
	return "DType(" + strconv.Itoa(int(d)) + ")"
}

// ParseDType parses a dtype name as returned by String.
func ParseDType(s string) (DType, error) {
	for d := Float32; d < numDTypes; d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("tensor: unknown dtype %q", s)
}
