package python_test

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

// The Python package (python/tensorferry) encodes messages to the bytes the
// Go side writes. The golden file holds the Go side's bytes for the values
// python/tests/test_codec.py encodes; this test checks the file is current
// (regenerate with: go test ./python -run TestGolden -update).

var update = flag.Bool("update", false, "rewrite python/tests/testdata/golden.json")

// Sample is a user message with a field of each kind a Python message
// can hold, in declared order.
type Sample struct {
	Name  string
	Count int
	Neg   int64
	Big   uint64
	Ratio float64
	Small float32
	Flag  bool
	Data  []byte
	Tags  map[string]string
	List  []int
	W     *tensor.Tensor
}

// Tagged is a user message with msgpack tags, as the library's own use.
type Tagged struct {
	Step  uint64            `msgpack:"step"`
	Loss  float64           `msgpack:"loss,omitempty"`
	Shard string            `msgpack:"shard"`
	Meta  map[string]string `msgpack:"meta,omitempty"`
}

// placeholder returns a tensor field that encodes as [1, id].
func placeholder(t *testing.T, id uint64) *tensor.Tensor {
	t.Helper()
	var p tensor.Tensor
	b := []byte{0x92, 1, 0xcf, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range 8 {
		b[3+i] = byte(id >> (56 - 8*i))
	}
	if _, err := p.UnmarshalMsg(b); err != nil {
		t.Fatal(err)
	}
	return &p
}

func goldenCases(t *testing.T) map[string][]byte {
	t.Helper()
	enc := func(v any) []byte {
		b, err := wire.EncodeMsgpack(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	long := make([]byte, 300)
	for i := range long {
		long[i] = byte(i)
	}
	m := &wire.Message{Target: "ps/shard-0", SenderNode: "py-1", SenderID: "worker",
		Type: "torchps.Push", Ser: wire.SerMsgpack, Body: []byte{0x80},
		Header: map[string]string{"z": "1", "a": "2"}, Request: 1 << 40, Tensors: []byte{0x90}}
	mb, err := m.MarshalMsg(nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"sample_zero": enc(Sample{}),
		"sample_full": enc(Sample{Name: "héllo", Count: 300, Neg: -40000, Big: math.MaxUint64,
			Ratio: 0.1, Small: 1.5, Flag: true, Data: long,
			Tags: map[string]string{"b": "2", "a": "1", "c": "3"},
			List: []int{0, -1, 127, 128, -33, 65536, -2147483649}, W: placeholder(t, 7)}),
		"sample_bigid":  enc(Sample{Name: string(make([]byte, 40)), W: placeholder(t, 1<<33)}),
		"tagged":        enc(Tagged{Step: 42, Shard: "s0"}),
		"tagged_full":   enc(Tagged{Step: 1, Loss: -2.5, Shard: "s1", Meta: map[string]string{"k": "v"}}),
		"envelope":      mb,
		"envelope_zero": must(t)((&wire.Message{}).MarshalMsg(nil)),
	}
}

func must(t *testing.T) func([]byte, error) []byte {
	return func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestGolden(t *testing.T) {
	got := map[string]string{}
	for k, v := range goldenCases(t) {
		got[k] = hex.EncodeToString(v)
	}
	want, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	path := filepath.Join("tests", "testdata", "golden.json")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with: go test ./python -run TestGolden -update)", err)
	}
	if string(have) != string(want) {
		t.Fatalf("%s is stale (regenerate with: go test ./python -run TestGolden -update):\nhave %s\nwant %s", path, have, want)
	}
}
