package etcdtest

import (
	"net"
	"testing"
)

// TestStartFindsPortTaken: when the client port found free is taken before
// etcd binds it, Start runs etcd again on other ports, and the server
// works.
func TestStartFindsPortTaken(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	calls := 0
	freeAddr = func(t testing.TB) string {
		calls++
		if calls == 1 {
			return busy.Addr().String() // the client port, taken
		}
		return FreeAddr(t)
	}
	defer func() { freeAddr = FreeAddr }()
	s := Start(t)
	if calls != 4 {
		t.Fatalf("%d ports asked for, want 4 (two runs of etcd)", calls)
	}
	before := s.Revision()
	s.Put("k", []byte("v"))
	if after := s.Revision(); after <= before {
		t.Fatalf("revision %d after a put, %d before", after, before)
	}
}
