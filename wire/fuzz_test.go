package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzReadFrame: ReadFrame never panics, returns a frame or an error, and
// allocates no more than a small multiple of its input.
func FuzzReadFrame(f *testing.F) {
	for _, tc := range frameCases() {
		f.Add(unhex(f, tc.hex))
	}
	for _, hb := range hostileBodies {
		body := unhex(f, hb.hex)
		f.Add(unhex(f, hdr(uint32(len(body)), FrameMessage, 0, 1)+hb.hex))
	}
	f.Add(unhex(f, "ffffffff 0c 00 0000 00000001"))
	f.Add(unhex(f, hdr(1<<24, 12, 0, 1)+"00000000")) // reserved type
	f.Fuzz(func(t *testing.T, in []byte) {
		// As NewFramer reads, and as a Conn with TransientMessages does
		// (single messages read into a reused frame, aliasing the buffer).
		for _, reuse := range []bool{false, true} {
			fr := NewFramer(nil, bytes.NewReader(in))
			fr.reuseMsg = reuse
			readFrames(t, fr, len(in))
		}
	})
}

// readFrames reads up to 4 frames of FuzzReadFrame's input (size bytes)
// from fr, checking each read's allocation and outcome.
func readFrames(t *testing.T, fr *Framer, size int) {
	for range 4 {
		var fm Frame
		var err error
		n := allocatedBytes(func() { fm, err = fr.ReadFrame() })
		// A MESSAGES frame's Message slice is bounded by
		// MaxBatchMessages, not by the input.
		if n > uint64(64<<10+batchSliceMax+8*size) {
			t.Fatalf("%d bytes allocated for %d bytes of input", n, size)
		}
		if err != nil {
			var ce *ConnError
			if err != io.EOF && !errors.As(err, &ce) {
				t.Fatalf("error %v is neither io.EOF nor a ConnError", err)
			}
			return
		}
		if int(fm.Header().Length) > size {
			t.Fatalf("frame of %d bytes from %d bytes of input", fm.Header().Length, size)
		}
	}
}

// rewrite writes frame f again with fr.
func rewrite(fr *Framer, f Frame) error {
	h := f.Header()
	var body any
	switch f := f.(type) {
	case *HelloFrame:
		body = &f.Hello
	case *ChallengeFrame:
		body = &f.Challenge
	case *AuthFrame:
		body = &f.Auth
	case *WelcomeFrame:
		body = &f.Welcome
	case *MessageFrame:
		body = &f.Message
	case *SystemFrame:
		body = &f.System
	case *PingFrame:
		body = &f.Ping
	case *PongFrame:
		body = &f.Pong
	case *GoAwayFrame:
		body = &f.GoAway
	case *ErrorFrame:
		body = &f.Error
	case *ReleaseFrame:
		body = &f.Release
	case *CapsFrame:
		body = &f.Caps
	case *MessagesFrame:
		return fr.WriteFrame(h.Type, h.Flags, h.Stream, appendMessagesPayload(nil, f.Messages))
	case *UnknownFrame:
		return fr.WriteFrame(h.Type, h.Flags, h.Stream, f.Payload)
	}
	return fr.WriteBody(h.Type, h.Flags, h.Stream, body)
}

// FuzzFrameRoundTrip: any frame that decodes re-encodes to a canonical form
// that decodes and re-encodes to exactly the same bytes.
func FuzzFrameRoundTrip(f *testing.F) {
	for _, tc := range frameCases() {
		f.Add(unhex(f, tc.hex))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		f1, err := NewFramer(nil, bytes.NewReader(in)).ReadFrame()
		if err != nil {
			return
		}
		var b1, b2 bytes.Buffer
		if err := rewrite(NewFramer(&b1, nil), f1); err != nil {
			t.Fatalf("re-encode %v: %v", f1.Header(), err)
		}
		f2, err := NewFramer(nil, bytes.NewReader(b1.Bytes())).ReadFrame()
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v\n%x", err, b1.Bytes())
		}
		if f2.Header().Type != f1.Header().Type || f2.Header().Stream != f1.Header().Stream || f2.Header().Flags != f1.Header().Flags {
			t.Fatalf("header changed: %v -> %v", f1.Header(), f2.Header())
		}
		if err := rewrite(NewFramer(&b2, nil), f2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1.Bytes(), b2.Bytes()) {
			t.Fatalf("not a fixpoint:\n%x\n%x", b1.Bytes(), b2.Bytes())
		}
	})
}

// FuzzCheckMsgpack: whatever checkMsgpack accepts is exactly one msgpack
// value that msgpack's own Skip walks to the end.
func FuzzCheckMsgpack(f *testing.F) {
	for _, hb := range hostileBodies {
		f.Add(unhex(f, hb.hex))
	}
	for _, tc := range frameCases() {
		if b := unhex(f, tc.hex); len(b) > HeaderSize {
			f.Add(b[HeaderSize:])
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// The fast paths accept and refuse what the general one does.
		fast, errFast := checkValue(in, MaxMsgpackDepth)
		slow, errSlow := checkValueBy(in, MaxMsgpackDepth, false)
		if (errFast == nil) != (errSlow == nil) || errFast == nil && len(fast) != len(slow) {
			t.Fatalf("checkValue: %d left, %v; through msgp alone: %d left, %v", len(fast), errFast, len(slow), errSlow)
		}
		if checkMsgpack(in, MaxMsgpackDepth) != nil {
			return
		}
		r := bytes.NewReader(in)
		dec := msgpack.NewDecoder(r)
		if err := dec.Skip(); err != nil {
			t.Fatalf("accepted, but msgpack cannot skip it: %v", err)
		}
		if r.Len() != 0 {
			t.Fatalf("accepted, but %d bytes follow the value", r.Len())
		}
		var v any
		_ = DecodeMsgpack(in, &v) // must not panic
	})
}

// FuzzHandshake feeds arbitrary bytes to an acceptor: it never panics,
// never hangs (the handshake deadline bounds it) and never succeeds.
func FuzzHandshake(f *testing.F) {
	var hello bytes.Buffer
	NewFramer(&hello, nil).WriteHello(&Hello{Version: ProtocolVersion, Cluster: "c", Nonce: make([]byte, NonceSize), Purpose: "control"})
	f.Add(hello.Bytes())
	withAuth := bytes.Clone(hello.Bytes())
	var auth bytes.Buffer
	NewFramer(&auth, nil).WriteAuth(&Auth{Node: "x", Incarnation: 1, MAC: make([]byte, 32)})
	f.Add(append(withAuth, auth.Bytes()...))
	for _, tc := range frameCases() {
		f.Add(unhex(f, tc.hex))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		wrote, drained := make(chan struct{}), make(chan struct{})
		go func() { // write the input, then hang up
			defer close(wrote)
			b.Write(in)
			b.Close()
		}()
		go func() { // read whatever the acceptor sends
			defer close(drained)
			io.Copy(io.Discard, b)
		}()
		cfg := testConfig("acceptor")
		cfg.Timeout = 50 * time.Millisecond
		start := time.Now()
		_, err := Handshake(context.Background(), a, cfg, false)
		if err == nil {
			t.Fatal("handshake with arbitrary bytes succeeded")
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("handshake took %v", d)
		}
		b.Close()
		<-wrote
		<-drained
	})
}

// FuzzMessageDecode: the Message decoder (msgp's readers) never panics,
// allocates in proportion to its input, and whatever it accepts
// vmihailenco's reflective decoder accepts too, with the same result.
func FuzzMessageDecode(f *testing.F) {
	// Keys in every form readKey meets: fixstr, str8, bin, two bytes that
	// pack like a one-byte key, a longer unknown key, and a fixstr key cut
	// short.
	for _, h := range []string{
		"83 a174a165 a2736ea16e a2747ca154",
		"82 d90174a165 c40273 69a173",
		"82 a20074a165 a1 74a166",
		"81 a3747979a17a",
		"81 a2 74",
		"81 a1",
		"82 a174d9036162 63a2 7479 a154",
	} {
		f.Add(unhex(f, h))
	}
	for _, hb := range hostileBodies {
		f.Add(unhex(f, hb.hex))
	}
	for _, tc := range frameCases() {
		if b := unhex(f, tc.hex); len(b) > HeaderSize {
			f.Add(b[HeaderSize:])
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var fast, slow Message
		var errFast error
		if n := allocatedBytes(func() { errFast = decodeMessage(in, &fast) }); n > uint64(64<<10+8*len(in)) {
			t.Fatalf("%d bytes allocated for %d bytes of input", n, len(in))
		}
		if errFast != nil {
			if !errors.Is(errFast, ErrBadBody) {
				t.Fatalf("error %v does not wrap ErrBadBody", errFast)
			}
			return
		}
		errSlow := checkMsgpack(in, MaxMsgpackDepth)
		if errSlow == nil {
			errSlow = decodeMsgpackChecked(in, &slow)
		}
		if errSlow != nil {
			t.Fatalf("msgp decoded %x, vmihailenco refuses it: %v", in, errSlow)
		}
		b1, err := EncodeMsgpack(&fast)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := EncodeMsgpack(&slow)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("decoders disagree: %+v vs %+v", fast, slow)
		}
	})
}

// batchSliceMax is the most a Framer allocates for a batch's Message slice.
var batchSliceMax = MaxBatchMessages * int(reflect.TypeFor[Message]().Size())

// FuzzMessagesDecode: the FrameMessages decoder never panics, allocates in
// proportion to its input, and whatever it accepts re-encodes to a
// canonical payload that decodes and re-encodes to the same bytes.
func FuzzMessagesDecode(f *testing.F) {
	f.Add(appendMessagesPayload(nil, []Message{{Target: "a", Type: "T", Ser: 1, Body: []byte{1}}, {Target: "b", SenderNode: "n", SenderID: "s", Request: 9,
		Header: map[string]string{"k": "v"}}}))
	f.Add(unhex(f, "92 80 81a174a161"))
	f.Add(unhex(f, "dd00000003 80 80"))
	f.Add(unhex(f, "dc0001 81a162c4ff"))
	for _, hb := range hostileBodies {
		f.Add(append([]byte{0x91}, unhex(f, hb.hex)...))
	}
	h := FrameHeader{Type: FrameMessages}
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := NewFramer(nil, nil)
		var fm Frame
		var err error
		n := allocatedBytes(func() { fm, err = fr.parseMessages(h, in) })
		if n > uint64(64<<10+batchSliceMax+8*len(in)) {
			t.Fatalf("%d bytes allocated for %d bytes of input", n, len(in))
		}
		if err != nil {
			var ce *ConnError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a ConnError", err)
			}
			return
		}
		b1 := appendMessagesPayload(nil, fm.(*MessagesFrame).Messages)
		f2, err := fr.parseMessages(h, b1)
		if err != nil {
			t.Fatalf("canonical payload does not decode: %v\n%x", err, b1)
		}
		if b2 := appendMessagesPayload(nil, f2.(*MessagesFrame).Messages); !bytes.Equal(b1, b2) {
			t.Fatalf("not a fixpoint:\n%x\n%x", b1, b2)
		}
	})
}
