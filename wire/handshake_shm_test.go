package wire

import (
	"bytes"
	"testing"
)

// TestHandshakeSharedMemory: the shared-memory upgrade is agreed only when
// the initiator offers it and the acceptor takes it up; both ends report
// the same.
func TestHandshakeSharedMemory(t *testing.T) {
	for _, tc := range []struct{ offer, take, want bool }{
		{false, false, false}, {true, false, false}, {false, true, false}, {true, true, true},
	} {
		ic, ac := testConfig("ini"), testConfig("acc")
		ic.SharedMemory, ac.SharedMemory = tc.offer, tc.take
		ini, acc, _, _ := handshakePair(t, ic, ac)
		if ini.err != nil || acc.err != nil {
			t.Fatalf("initiator: %v, acceptor: %v", ini.err, acc.err)
		}
		if ini.peer.SharedMemory != tc.want || acc.peer.SharedMemory != tc.want {
			t.Errorf("offer %v, take up %v: initiator's peer says %v, acceptor's %v, want %v",
				tc.offer, tc.take, ini.peer.SharedMemory, acc.peer.SharedMemory, tc.want)
		}
	}
}

// TestHelloSharedMemoryBytes: the offer is one more key of Hello's and
// Welcome's maps ("s": true), absent when false, so the frames of a node
// that does not offer it are those of before.
func TestHelloSharedMemoryBytes(t *testing.T) {
	var b bytes.Buffer
	if err := NewFramer(&b, nil).WriteHello(&Hello{Version: 1, SharedMemory: true}); err != nil {
		t.Fatal(err)
	}
	want := unhex(t, hdr(7, FrameHello, 0, 0)+"82 a176 01 a173 c3")
	if !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("got % x, want % x", b.Bytes(), want)
	}
	f, err := NewFramer(nil, &b).ReadFrame()
	if err != nil || !f.(*HelloFrame).Hello.SharedMemory {
		t.Fatalf("read back %+v, %v", f, err)
	}
	b.Reset()
	if err := NewFramer(&b, nil).WriteWelcome(&Welcome{Node: "a", SharedMemory: true}); err != nil {
		t.Fatal(err)
	}
	f, err = NewFramer(nil, &b).ReadFrame()
	if err != nil || !f.(*WelcomeFrame).Welcome.SharedMemory {
		t.Fatalf("read back %+v, %v", f, err)
	}
}
