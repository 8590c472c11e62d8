package rawtcp

import (
	"bytes"
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestSend(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		testSend(t, fresh)
	}
}

func testSend(t *testing.T, fresh bool) {
	defer goleak.VerifyNone(t)
	var got []byte
	p, err := Open(Options{Receive: func(b []byte) error { got = append(got[:0], b...); return nil }, FreshBuffer: fresh})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, n := range []int{0, 1, 4 << 10, 3<<20 + 7} {
		b := bytes.Repeat([]byte{byte(n)}, n)
		d, err := p.Send(b)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if d <= 0 || !bytes.Equal(got, b) {
			t.Fatalf("%d bytes: took %v, received %d bytes (equal %v)", n, d, len(got), bytes.Equal(got, b))
		}
		p.FreeBuffer()
	}
}

func TestReceiveError(t *testing.T) {
	defer goleak.VerifyNone(t)
	boom := errors.New("boom")
	p, err := Open(Options{Receive: func([]byte) error { return boom }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Send([]byte("x")); !errors.Is(err, boom) {
		t.Fatalf("Send: %v, want the receiver's error", err)
	}
}
