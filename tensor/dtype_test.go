package tensor

import (
	"errors"
	"testing"
)

func TestDTypes(t *testing.T) {
	tests := []struct {
		dt   DType
		name string
		size int
	}{
		{Float32, "float32", 4},
		{Float16, "float16", 2},
		{BFloat16, "bfloat16", 2},
		{Float64, "float64", 8},
		{Int8, "int8", 1},
		{Int16, "int16", 2},
		{Int32, "int32", 4},
		{Int64, "int64", 8},
		{Uint8, "uint8", 1},
		{Bool, "bool", 1},
	}
	if got := len(AllDTypes()); got != len(tests) {
		t.Fatalf("AllDTypes has %d dtypes, the table %d", got, len(tests))
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if AllDTypes()[i] != tc.dt {
				t.Errorf("AllDTypes()[%d] = %v", i, AllDTypes()[i])
			}
			if !tc.dt.Valid() || tc.dt.Size() != tc.size || tc.dt.String() != tc.name {
				t.Errorf("%d: valid %v size %d name %q", tc.dt, tc.dt.Valid(), tc.dt.Size(), tc.dt)
			}
			got, err := ParseDType(tc.name)
			if err != nil || got != tc.dt {
				t.Errorf("ParseDType(%q) = %v, %v", tc.name, got, err)
			}
		})
	}
}

func TestInvalidDTypes(t *testing.T) {
	for _, dt := range []DType{Invalid, numDTypes, 200, 255} {
		if dt.Valid() || dt.Size() != 0 {
			t.Errorf("%d: valid %v size %d", dt, dt.Valid(), dt.Size())
		}
		if dt.String() == "" {
			t.Errorf("%d has no name", dt)
		}
		if _, err := (Shape{1}).ByteSize(dt); !errors.Is(err, ErrBadDType) {
			t.Errorf("ByteSize with %d: %v", dt, err)
		}
	}
	for _, s := range []string{"", "invalid", "Float32", "float", "int128", "DType(12)"} {
		if _, err := ParseDType(s); err == nil {
			t.Errorf("ParseDType(%q) succeeded", s)
		}
	}
}
