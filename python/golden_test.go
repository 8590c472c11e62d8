package python_test

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
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

// ipcRequest and ipcReply are rdma/ipc's control messages (its request and
// reply, unexported there), field for field: the ipc channel encodes them
// with msgpack.Marshal, and python/tensorferry/ipc.py writes the same bytes.
type ipcRequest struct {
	Op          uint8    `msgpack:"o"`
	Incarnation uint64   `msgpack:"i,omitempty"`
	ExportID    uint64   `msgpack:"x,omitempty"`
	Lease       uint64   `msgpack:"l,omitempty"`
	Acq         uint64   `msgpack:"q,omitempty"`
	Alloc       uint64   `msgpack:"a,omitempty"`
	Offset      uint64   `msgpack:"f,omitempty"`
	Bytes       uint64   `msgpack:"b,omitempty"`
	WantHandle  bool     `msgpack:"w,omitempty"`
	Challenge   uint64   `msgpack:"c,omitempty"`
	MAC         []byte   `msgpack:"m,omitempty"`
	Revoked     []uint64 `msgpack:"r,omitempty"`
}

type ipcReply struct {
	Code      wire.ErrCode `msgpack:"c"`
	Msg       string       `msgpack:"m,omitempty"`
	Handle    []byte       `msgpack:"h,omitempty"`
	MapSize   uint64       `msgpack:"n,omitempty"`
	Shift     uint64       `msgpack:"s,omitempty"`
	Base      uint64       `msgpack:"b,omitempty"`
	Device    int          `msgpack:"d,omitempty"`
	Process   []byte       `msgpack:"p,omitempty"`
	Revoked   []uint64     `msgpack:"r,omitempty"`
	Challenge uint64       `msgpack:"k,omitempty"`
	Path      string       `msgpack:"f,omitempty"`
}

// ipcOffer is rdma/ipc's offer encoding (offer.encode): version 2, then
// little-endian allocation, offset, bytes, allocation size, flags,
// deadline.
func ipcOffer(alloc, off, n, size uint64, flags uint8, deadline uint64) []byte {
	b := make([]byte, 42)
	b[0] = 2
	binary.LittleEndian.PutUint64(b[1:], alloc)
	binary.LittleEndian.PutUint64(b[9:], off)
	binary.LittleEndian.PutUint64(b[17:], n)
	binary.LittleEndian.PutUint64(b[25:], size)
	b[33] = flags
	binary.LittleEndian.PutUint64(b[34:], deadline)
	return b
}

// ipcCases are the ipc channel's messages for the values
// python/tests/test_ipc.py encodes.
func ipcCases(t *testing.T) map[string][]byte {
	t.Helper()
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mac := make([]byte, 32)
	handle := make([]byte, 64)
	for i := range handle {
		handle[i] = byte(255 - i)
		if i < len(mac) {
			mac[i] = byte(i)
		}
	}
	return map[string][]byte{
		"ipc_request_challenge": enc(&ipcRequest{Op: 1}),
		"ipc_request_prove":     enc(&ipcRequest{Op: 2, Challenge: 12345678901, MAC: mac}),
		"ipc_request_begin": enc(&ipcRequest{Op: 3, Incarnation: 1<<40 + 5, ExportID: 7, Lease: 0xdeadbeefcafef00d,
			Acq: 99, Alloc: 3, Offset: 4096, Bytes: 1 << 20, WantHandle: true}),
		"ipc_request_end":    enc(&ipcRequest{Op: 4, Acq: 1}),
		"ipc_request_revoke": enc(&ipcRequest{Op: 5, Incarnation: 9, Revoked: []uint64{1, 1 << 33}}),
		"ipc_reply_ok":       enc(&ipcReply{}),
		"ipc_reply_handle": enc(&ipcReply{Handle: handle, MapSize: 2 << 20, Base: 0x7f0000000000, Device: 1,
			Revoked: []uint64{5}}),
		"ipc_reply_challenge": enc(&ipcReply{Challenge: 77, Path: "/dev/shm/tensorferry-ipc-00ff"}),
		"ipc_reply_error":     enc(&ipcReply{Code: wire.CodeAuth, Msg: "ipc: peer has not proven it runs on this host"}),
		"ipc_offer":           ipcOffer(3, 4096, 1<<20, 2<<20, 0, 0),
		"ipc_offer_direct":    ipcOffer(1<<40, 0, 64, 1<<21, 1, 123456789),
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
	for k, v := range ipcCases(t) {
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
