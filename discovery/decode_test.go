package discovery

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
)

// Answers of etcd 3.4.23's gateway, as captured.
const (
	hdr            = `"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"4","raft_term":"2"}`
	grantAnswer    = `{` + hdr + `,"ID":"2324035583755436293","TTL":"2"}`
	keepaliveAlive = `{"result":{` + hdr + `,"ID":"12345","TTL":"2"}}` + "\n"
	keepaliveGone  = `{"result":{` + hdr + `,"ID":"12345"}}` + "\n"
	errorAnswer    = `{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}`
	rangeAnswer    = `{` + hdr + `,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"more":true,"count":"3"}`
	txnFailed      = `{` + hdr + `,"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy","lease":"77"}],"count":"1"}}]}`
	txnSucceeded   = `{` + hdr + `,"succeeded":true,"responses":[{"response_put":{"header":{"revision":"4"}}}]}`
	watchCreated   = `{"result":{` + hdr + `,"created":true}}`
	watchEvents    = `{"result":{` + hdr + `,"events":[{"kv":{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"eg==","lease":"2324035583755436303"}},{"type":"DELETE","kv":{"key":"Zm9v","mod_revision":"4"}}]}}`
	watchCompacted = `{"result":{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","raft_term":"2"},"canceled":true,"compact_revision":"4"}}`
	watchError     = `{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}`
	nodeValue      = `{"name":"node1","address":"127.0.0.1:7001","data_address":"127.0.0.1:7101","devices":["cpu","cuda:1"]}`
)

func TestDecodeAnswers(t *testing.T) {
	id, ttl, err := decodeGrant([]byte(grantAnswer))
	if err != nil || id != 2324035583755436293 || ttl != 2 {
		t.Errorf("grant: %d %d %v", id, ttl, err)
	}
	if _, _, err := decodeGrant([]byte(`{` + hdr + `}`)); err == nil {
		t.Error("grant without a lease accepted")
	}
	if ttl, err := decodeKeepalive([]byte(keepaliveAlive), 12345); err != nil || ttl != 2 {
		t.Errorf("keepalive: %d %v", ttl, err)
	}
	if ttl, err := decodeKeepalive([]byte(keepaliveGone), 12345); err != nil || ttl != 0 {
		t.Errorf("keepalive of a gone lease: %d %v", ttl, err)
	}
	if _, err := decodeKeepalive([]byte(keepaliveAlive), 54321); err == nil {
		t.Error("keepalive answer for another lease accepted")
	}
	e, err := decodeError([]byte(errorAnswer))
	if err != nil || e.Code != 5 || !errors.Is(e, errLeaseNotFound) {
		t.Errorf("error: %v %v", e, err)
	}
	r, err := decodeRange([]byte(rangeAnswer))
	if err != nil || r.Header.Revision != 4 || !r.More || len(r.Kvs) != 1 || string(r.Kvs[0].Key) != "foo" || string(r.Kvs[0].Value) != "bar" || r.Kvs[0].ModRevision != 2 {
		t.Errorf("range: %+v %v", r, err)
	}
	ok, kvs, err := decodeTxn([]byte(txnFailed))
	if err != nil || ok || len(kvs) != 1 || kvs[0].Lease != 77 {
		t.Errorf("failed txn: %v %+v %v", ok, kvs, err)
	}
	ok, kvs, err = decodeTxn([]byte(txnSucceeded))
	if err != nil || !ok || kvs != nil {
		t.Errorf("txn: %v %+v %v", ok, kvs, err)
	}
	w, err := decodeWatch([]byte(watchCreated))
	if err != nil || !w.created || len(w.events) != 0 {
		t.Errorf("watch created: %+v %v", w, err)
	}
	w, err = decodeWatch([]byte(watchEvents))
	if err != nil || len(w.events) != 2 || w.events[0].Type != "" || string(w.events[0].Kv.Value) != "z" ||
		w.events[1].Type != "DELETE" || w.events[1].Kv.ModRevision != 4 {
		t.Errorf("watch events: %+v %v", w, err)
	}
	var compacted *errCompacted
	if _, err := decodeWatch([]byte(watchCompacted)); !errors.As(err, &compacted) || compacted.rev != 4 {
		t.Errorf("watch compacted: %v", err)
	}
	var ee *etcdError
	if _, err := decodeWatch([]byte(watchError)); !errors.As(err, &ee) || ee.Code != 14 {
		t.Errorf("watch error: %v", err)
	}
	for _, bad := range []string{``, `null`, `{}`, `{"result":{"events":[{"type":"EXPLODE","kv":{"mod_revision":"3"}}]}}`,
		`{"result":{"events":[{"kv":{"key":"Zm9v"}}]}}`, `{"result":{"header":{"revision":"x"}}}`} {
		if _, err := decodeWatch([]byte(bad)); err == nil {
			t.Errorf("watch %q accepted", bad)
		}
	}
}

func TestDecodeNode(t *testing.T) {
	n, leaving, err := decodeNode([]byte(nodeValue))
	want := config.NodeConfig{Name: "node1", Address: "127.0.0.1:7001", DataAddress: "127.0.0.1:7101", GossipAddress: "127.0.0.1:7201",
		Devices: []memory.Device{memory.CPU, memory.CUDA(1)}}
	if err != nil || leaving || !sameNode(n, want) {
		t.Fatalf("decodeNode: %+v %v %v", n, leaving, err)
	}
	b, err := encodeNode(n, true)
	if err != nil {
		t.Fatal(err)
	}
	// The gossip address that decoding filled in is announced from then on.
	wantValue := `{"name":"node1","address":"127.0.0.1:7001","data_address":"127.0.0.1:7101","gossip_address":"127.0.0.1:7201","devices":["cpu","cuda:1"],"leaving":true}`
	if got := string(b); got != wantValue {
		t.Errorf("encodeNode: %s", got)
	}
	// A mesh_only node: no gossip address derived; the same bytes as
	// python/tests/test_discovery.py's test_mesh_only_mark.
	m := config.NodeConfig{Name: "py", Address: "127.0.0.1:7001", DataAddress: "127.0.0.1:7201", MeshOnly: true,
		Devices: []memory.Device{memory.CUDA(1)}}
	meshOnlyValue := `{"name":"py","address":"127.0.0.1:7001","data_address":"127.0.0.1:7201","devices":["cuda:1"],"mesh_only":true,"leaving":true}`
	if b, err := encodeNode(m, true); err != nil || string(b) != meshOnlyValue {
		t.Errorf("encodeNode(mesh_only): %s %v", b, err)
	}
	if n, leaving, err := decodeNode([]byte(meshOnlyValue)); err != nil || !leaving || !sameNode(n, m) {
		t.Errorf("decodeNode(mesh_only): %+v %v %v", n, leaving, err)
	}
	o := m
	o.MeshOnly = false
	if sameNode(m, o) {
		t.Error("sameNode ignores the mesh_only mark")
	}
	for _, tc := range []struct{ name, value, want string }{
		{"not json", `{`, "value"},
		{"mesh_only not a boolean", `{"name":"a","address":"127.0.0.1:1","mesh_only":1}`, "value"},
		{"mesh_only with a gossip address", `{"name":"a","address":"127.0.0.1:1","gossip_address":"127.0.0.1:7","mesh_only":true}`, "gossip_address: set on a mesh_only node"},
		{"no name", `{"address":"127.0.0.1:1"}`, "name: required"},
		{"bad address", `{"name":"a","address":"127.0.0.1"}`, "address"},
		{"bad data address", `{"name":"a","address":"127.0.0.1:1","data_address":":x"}`, "data_address"},
		{"same addresses", `{"name":"a","address":"127.0.0.1:1","data_address":"127.0.0.1:1"}`, "same as address"},
		{"bad device", `{"name":"a","address":"127.0.0.1:1","devices":["tpu"]}`, "devices[0]"},
		{"duplicate device", `{"name":"a","address":"127.0.0.1:1","devices":["cpu","cpu"]}`, "duplicate"},
		{"trailing data", `{"name":"a","address":"127.0.0.1:1"}{}`, "after the object"},
		{"too large", `{"name":"a","address":"127.0.0.1:1","x":"` + strings.Repeat("x", maxValue) + `"}`, "at most"},
	} {
		if _, _, err := decodeNode([]byte(tc.value)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestReadLine(t *testing.T) {
	r := bufio.NewReaderSize(strings.NewReader("ab\n"+strings.Repeat("x", 40)+"\nlast"), 16)
	for _, want := range []string{"ab\n", strings.Repeat("x", 40) + "\n", "last"} {
		got, err := readLine(r, 64)
		if err != nil || string(got) != want {
			t.Fatalf("readLine = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := readLine(r, 64); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("at the end: %v", err)
	}
	r = bufio.NewReaderSize(strings.NewReader(strings.Repeat("x", 100)+"\n"), 16)
	if _, err := readLine(r, 64); err == nil {
		t.Error("a line over the bound was read")
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/tf/", "/tf0"}, {"a\xff", "b"}, {"\xff\xff", "\x00"},
	} {
		if got := string(prefixEnd([]byte(tc.in))); got != tc.want {
			t.Errorf("prefixEnd(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzDecodeGrant(f *testing.F) {
	f.Add([]byte(grantAnswer))
	f.Add([]byte(errorAnswer))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ttl, err := decodeGrant(b)
		if err == nil && (id == 0 || ttl <= 0) {
			t.Fatalf("accepted lease %d ttl %d", id, ttl)
		}
	})
}

func FuzzDecodeKeepalive(f *testing.F) {
	f.Add([]byte(keepaliveAlive))
	f.Add([]byte(keepaliveGone))
	f.Add([]byte(watchError))
	f.Fuzz(func(t *testing.T, b []byte) {
		if ttl, err := decodeKeepalive(b, 12345); err == nil && ttl < 0 {
			t.Fatalf("negative ttl %d", ttl)
		}
	})
}

func FuzzDecodeError(f *testing.F) {
	f.Add([]byte(errorAnswer))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := decodeError(b); err == nil && (e.Message == "" || len(e.Message) > 512+len("…")) {
			t.Fatalf("message %q", e.Message)
		}
	})
}

func FuzzDecodeRange(f *testing.F) {
	f.Add([]byte(rangeAnswer))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRange(b); err == nil && r.Header.Revision <= 0 {
			t.Fatalf("revision %d", r.Header.Revision)
		}
	})
}

func FuzzDecodeTxn(f *testing.F) {
	f.Add([]byte(txnFailed))
	f.Add([]byte(txnSucceeded))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = decodeTxn(b)
	})
}

func FuzzDecodeWatch(f *testing.F) {
	for _, s := range []string{watchCreated, watchEvents, watchCompacted, watchError} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := decodeWatch(b)
		if err != nil {
			return
		}
		for _, ev := range w.events {
			if ev.Kv.ModRevision <= 0 || (ev.Type != "" && ev.Type != "PUT" && ev.Type != "DELETE") {
				t.Fatalf("accepted event %+v", ev)
			}
		}
	})
}

func FuzzDecodeNode(f *testing.F) {
	f.Add([]byte(nodeValue))
	f.Add([]byte(`{"name":"a","address":"[::1]:7000","devices":["pinned","cuda:7"],"leaving":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, leaving, err := decodeNode(b)
		if err != nil {
			return
		}
		// What is accepted is valid, and survives a round trip.
		if err := config.CheckNode(&n); err != nil {
			t.Fatalf("accepted an invalid node: %v", err)
		}
		enc, err := encodeNode(n, leaving)
		if err != nil {
			t.Fatal(err)
		}
		back, l2, err := decodeNode(enc)
		if err != nil || l2 != leaving || !sameNode(back, n) {
			t.Fatalf("round trip: %+v %v %v, want %+v", back, l2, err, n)
		}
	})
}

func FuzzReadLine(f *testing.F) {
	f.Add([]byte(watchCreated+"\n"+watchEvents+"\n"), 64)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		max = max%4096 + 1
		if max <= 0 {
			max += 4096
		}
		r := bufio.NewReaderSize(bytes.NewReader(b), 16)
		for {
			line, err := readLine(r, max)
			if err != nil {
				return
			}
			if len(line) > max {
				t.Fatalf("line of %d bytes, bound %d", len(line), max)
			}
		}
	})
}
