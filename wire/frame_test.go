package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// hdr returns a frame header in hex.
func hdr(length uint32, t FrameType, flags Flags, stream uint32) string {
	var b [HeaderSize]byte
	binary.BigEndian.PutUint32(b[0:], length)
	b[4], b[5] = byte(t), byte(flags)
	binary.BigEndian.PutUint32(b[8:], stream)
	return hex.EncodeToString(b[:])
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

type frameCase struct {
	name  string
	write func(fr *Framer) error
	hex   string // expected bytes on the wire
	want  Frame  // expected result of ReadFrame
}

// frameCases hold the exact bytes of one frame of every type. Bodies are
// msgpack maps with short keys, zero fields omitted, compact integers.
func frameCases() []frameCase {
	return []frameCase{
		{
			name: "hello",
			write: func(fr *Framer) error {
				return fr.WriteHello(&Hello{Version: 1, Cluster: "c1", Nonce: []byte{1, 2, 3}, Purpose: "control"})
			},
			// {v:1, c:"c1", n:bin(010203), p:"control"}
			hex:  hdr(26, FrameHello, 0, 0) + "84 a176 01 a163 a26331 a16e c403010203 a170 a7636f6e74726f6c",
			want: &HelloFrame{FrameHeader{26, FrameHello, 0, 0}, Hello{1, "c1", []byte{1, 2, 3}, "control", false}},
		},
		{
			name:  "challenge",
			write: func(fr *Framer) error { return fr.WriteChallenge(&Challenge{Version: 1, Nonce: []byte{0xaa}}) },
			hex:   hdr(9, FrameChallenge, 0, 0) + "82 a176 01 a16e c401aa",
			want:  &ChallengeFrame{FrameHeader{9, FrameChallenge, 0, 0}, Challenge{1, []byte{0xaa}}},
		},
		{
			name:  "auth",
			write: func(fr *Framer) error { return fr.WriteAuth(&Auth{Node: "n1", Incarnation: 300, MAC: []byte{1, 2}}) },
			// 300 is a uint16: cd 012c
			hex:  hdr(17, FrameAuth, 0, 0) + "83 a16e a26e31 a169 cd012c a16d c4020102",
			want: &AuthFrame{FrameHeader{17, FrameAuth, 0, 0}, Auth{"n1", 300, []byte{1, 2}}},
		},
		{
			name:  "welcome",
			write: func(fr *Framer) error { return fr.WriteWelcome(&Welcome{Node: "a", Incarnation: 1 << 40}) },
			// MAC omitted; 1<<40 is a uint64: cf 0000010000000000
			hex:  hdr(16, FrameWelcome, 0, 0) + "82 a16e a161 a169 cf0000010000000000",
			want: &WelcomeFrame{FrameHeader{16, FrameWelcome, 0, 0}, Welcome{"a", 1 << 40, nil, false}},
		},
		{
			name: "message",
			write: func(fr *Framer) error {
				return fr.WriteMessage(5, &Message{Target: "t", SenderNode: "n", Type: "T", Ser: 1,
					Body: []byte{0xff}, Header: map[string]string{"k": "v"}, Request: 7})
			},
			// {t:"t", sn:"n", ty:"T", s:1, b:bin(ff), h:{k:"v"}, r:7}; si omitted
			hex: hdr(33, FrameMessage, 0, 5) + "87 a174 a174 a2736e a16e a27479 a154 a173 01 a162 c401ff a168 81a16ba176 a172 07",
			want: &MessageFrame{FrameHeader{33, FrameMessage, 0, 5}, Message{Target: "t", SenderNode: "n", Type: "T", Ser: 1,
				Body: []byte{0xff}, Header: map[string]string{"k": "v"}, Request: 7}},
		},
		{
			name: "messages",
			write: func(fr *Framer) error {
				return fr.WriteMessages([]Message{{Target: "a", Type: "T", Ser: 1, Body: []byte{0xff}}, {Target: "b"}})
			},
			// [{t:"a", ty:"T", s:1, b:bin(ff)}, {t:"b"}] as an array32
			hex: hdr(28, FrameMessages, 0, 0) + "dd00000002 84 a174 a161 a27479 a154 a173 01 a162 c401ff 81 a174 a162",
			want: &MessagesFrame{FrameHeader{28, FrameMessages, 0, 0}, []Message{
				{Target: "a", Type: "T", Ser: 1, Body: []byte{0xff}}, {Target: "b"}}},
		},
		{
			name: "system",
			write: func(fr *Framer) error {
				return fr.WriteSystem(&System{Kind: SystemTerminated, Target: "x", Why: -1, Detail: "d"})
			},
			// -1 is a negative fixint ff
			hex:  hdr(15, FrameSystem, 0, 0) + "84 a16b 03 a174 a178 a177 ff a164 a164",
			want: &SystemFrame{FrameHeader{15, FrameSystem, 0, 0}, System{Kind: SystemTerminated, Target: "x", Why: -1, Detail: "d"}},
		},
		{
			name:  "ping",
			write: func(fr *Framer) error { return fr.WritePing(&Ping{Seq: 1, UnixNano: -33}) },
			// -33 is an int8: d0 df
			hex:  hdr(8, FramePing, 0, 0) + "82 a173 01 a174 d0df",
			want: &PingFrame{FrameHeader{8, FramePing, 0, 0}, Ping{1, -33}},
		},
		{
			name:  "pong",
			write: func(fr *Framer) error { return fr.WritePong(&Pong{Seq: 128}) },
			hex:   hdr(5, FramePong, 0, 0) + "81 a173 cc80",
			want:  &PongFrame{FrameHeader{5, FramePong, 0, 0}, Pong{128, 0}},
		},
		{
			name:  "empty ping",
			write: func(fr *Framer) error { return fr.WritePing(&Ping{}) },
			hex:   hdr(1, FramePing, 0, 0) + "80",
			want:  &PingFrame{FrameHeader{1, FramePing, 0, 0}, Ping{}},
		},
		{
			name:  "goaway",
			write: func(fr *Framer) error { return fr.WriteGoAway(&GoAway{Code: CodeShutdown, Reason: "bye"}) },
			hex:   hdr(10, FrameGoAway, 0, 0) + "82 a163 0d a172 a3627965",
			want:  &GoAwayFrame{FrameHeader{10, FrameGoAway, 0, 0}, GoAway{CodeShutdown, "bye"}},
		},
		{
			name:  "error",
			write: func(fr *Framer) error { return fr.WriteError(&Error{Code: CodeNotFound, Stream: 9, Msg: "no"}) },
			hex:   hdr(12, FrameError, FlagEndStream, 9) + "83 a163 07 a173 09 a16d a26e6f",
			want:  &ErrorFrame{FrameHeader{12, FrameError, FlagEndStream, 9}, Error{CodeNotFound, 9, "no"}},
		},
		{
			// 11, 12 and 13 are reserved (once FETCH, DATA, FETCH_END).
			name:  "reserved type",
			write: func(fr *Framer) error { return fr.WriteFrame(12, 0, 3, []byte("abc")) },
			hex:   hdr(3, 12, 0, 3) + "616263",
			want:  &UnknownFrame{FrameHeader{3, 12, 0, 3}, []byte("abc")},
		},
		{
			name:  "release",
			write: func(fr *Framer) error { return fr.WriteRelease(&Release{ExportID: 1, Lease: 2, Incarnation: 3}) },
			hex:   hdr(10, FrameRelease, 0, 0) + "83 a165 01 a16c 02 a169 03",
			want:  &ReleaseFrame{FrameHeader{10, FrameRelease, 0, 0}, Release{1, 2, 3}},
		},
		{
			name:  "caps",
			write: func(fr *Framer) error { return fr.WriteCaps(&Caps{Body: []byte{0x80}}) },
			hex:   hdr(6, FrameCaps, 0, 0) + "81 a162 c40180",
			want:  &CapsFrame{FrameHeader{6, FrameCaps, 0, 0}, Caps{[]byte{0x80}}},
		},
		{
			name:  "raw unknown type",
			write: func(fr *Framer) error { return fr.WriteFrame(200, 0x81, 1<<31, []byte{9, 8}) },
			hex:   hdr(2, 200, 0x81, 1<<31) + "0908",
			want:  &UnknownFrame{FrameHeader{2, 200, 0x81, 1 << 31}, []byte{9, 8}},
		},
		{
			name:  "body via WriteBody",
			write: func(fr *Framer) error { return fr.WriteBody(FrameRelease, FlagEndStream, 4, &Release{Lease: 1}) },
			hex:   hdr(4, FrameRelease, FlagEndStream, 4) + "81 a16c 01",
			want:  &ReleaseFrame{FrameHeader{4, FrameRelease, FlagEndStream, 4}, Release{Lease: 1}},
		},
	}
}

// countingWriter counts Write calls.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

func TestFrameExactBytes(t *testing.T) {
	for _, tc := range frameCases() {
		t.Run(tc.name, func(t *testing.T) {
			var w countingWriter
			fr := NewFramer(&w, nil)
			if err := tc.write(fr); err != nil {
				t.Fatal(err)
			}
			if w.writes != 1 {
				t.Errorf("%d Write calls, want 1", w.writes)
			}
			want := unhex(t, tc.hex)
			if !bytes.Equal(w.Bytes(), want) {
				t.Fatalf("wrote\n%x\nwant\n%x", w.Bytes(), want)
			}
			got, err := NewFramer(nil, bytes.NewReader(want)).ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("read %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestReadFrameSequence(t *testing.T) {
	var buf bytes.Buffer
	fr := NewFramer(&buf, &buf)
	cases := frameCases()
	for _, tc := range cases {
		if err := tc.write(fr); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range cases {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(f, tc.want) {
			t.Fatalf("%s: read %#v", tc.name, f)
		}
	}
	if _, err := fr.ReadFrame(); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestWriteFrameLarge(t *testing.T) {
	p := bytes.Repeat([]byte{7}, 1<<20)
	var w bytes.Buffer
	fr := NewFramer(&w, &w)
	if err := fr.WriteFrame(200, FlagEndStream, 1, p); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	u := f.(*UnknownFrame)
	if u.Stream != 1 || !bytes.Equal(u.Payload, p) || u.Length != 1<<20 || !u.Flags.Has(FlagEndStream) {
		t.Fatalf("got %v, %d bytes", u.FrameHeader, len(u.Payload))
	}
}

func TestWriteTooLarge(t *testing.T) {
	var w bytes.Buffer
	fr := NewFramer(&w, nil)
	fr.SetMaxWriteFrameSize(16)
	if err := fr.WriteFrame(FrameMessage, 0, 0, make([]byte, 17)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("WriteFrame: %v", err)
	}
	if err := fr.WriteMessage(1, &Message{Body: make([]byte, 32)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("WriteMessage: %v", err)
	}
	if w.Len() != 0 {
		t.Fatalf("%d bytes written for rejected frames", w.Len())
	}
	if err := fr.WriteFrame(200, 0, 1, make([]byte, 16)); err != nil {
		t.Fatalf("frame of exactly the maximum: %v", err)
	}
}

// msgpack bodies that lie about their lengths.
var hostileBodies = []struct {
	name string
	hex  string
}{
	{"bin32 4 GiB", "81 a162 c6ffffffff 00"},
	{"header map of 65536 entries", "81 a168 deffff a130 a0"},
	{"str32 4 GiB", "81 a174 dbffffffff"},
	{"array32 huge", "81 a168 ddffffffff 01"},
	{"map32 huge", "81 a168 dfffffffff 01"},
	{"map16 more pairs than bytes", "81 a168 de0003 a161a162 a163"},
	{"array16 more items than bytes", "81 a174 dc0010 010203"},
	{"ext32 huge", "81 a162 c9ffffffff 01"},
	{"bin8 past end", "81 a162 c405 0102"},
	{"fixstr past end", "81 a174 a5 6162"},
	{"trailing garbage", "81 a174 a161 00"},
	{"empty", ""},
	{"never-used code", "81 a174 c1"},
	{"missing map value", "82 a174 a161 a173"},
	{"too deep", strings.Repeat("91", MaxMsgpackDepth+1) + "00"},
	{"wrong type", "81 a174 cb3ff0000000000000"},
	{"not a map", "05"},
	{"header map with int values", "81 a168 81 a161 01"},
}

func TestReadFrameBadInput(t *testing.T) {
	tests := []struct {
		name    string
		hex     string
		wantErr error
		code    ErrCode
	}{
		{"truncated header", "00000000 05", ErrShortFrame, CodeFrameSize},
		{"truncated payload", hdr(4, FramePing, 0, 0) + "81a173", ErrShortFrame, CodeFrameSize},
		{"4 GiB length", "ffffffff 05 00 0000 00000000", ErrFrameTooLarge, CodeFrameSize},
		{"just over the maximum", hdr(DefaultMaxFrameSize+1, FramePing, 0, 1), ErrFrameTooLarge, CodeFrameSize},
		{"reserved bits", "00000001 07 00 0001 00000000 80", ErrBadHeader, CodeProtocol},
		{"empty message body", hdr(0, FrameMessage, 0, 0), ErrBadBody, CodeProtocol},
	}
	for _, hb := range hostileBodies {
		body := unhex(t, hb.hex)
		tests = append(tests, struct {
			name    string
			hex     string
			wantErr error
			code    ErrCode
		}{"message body: " + hb.name, hdr(uint32(len(body)), FrameMessage, 0, 1) + hb.hex, ErrBadBody, CodeProtocol})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFramer(nil, bytes.NewReader(unhex(t, tc.hex))).ReadFrame()
			if err == nil {
				t.Fatalf("got frame %#v, want error", f)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v does not wrap %v", err, tc.wantErr)
			}
			var ce *ConnError
			if !errors.As(err, &ce) || ce.Code != tc.code {
				t.Fatalf("error %v is not a ConnError with code %s", err, tc.code)
			}
			if !strings.HasPrefix(err.Error(), "wire: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestReadFrameEOF(t *testing.T) {
	if _, err := NewFramer(nil, bytes.NewReader(nil)).ReadFrame(); err != io.EOF {
		t.Fatalf("got %v, want io.EOF", err)
	}
}

func TestReadFrameUnknownType(t *testing.T) {
	f, err := NewFramer(nil, bytes.NewReader(unhex(t, hdr(1, 99, 0, 3)+"ff"))).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	u, ok := f.(*UnknownFrame)
	if !ok || u.Type != 99 || !bytes.Equal(u.Payload, []byte{0xff}) {
		t.Fatalf("got %#v", f)
	}
	if got := u.Type.String(); got != "UNKNOWN_FRAME_TYPE_99" {
		t.Fatalf("String() = %q", got)
	}
}

func TestSetMaxReadFrameSize(t *testing.T) {
	in := unhex(t, hdr(100, 200, 0, 1)+strings.Repeat("00", 100))
	fr := NewFramer(nil, bytes.NewReader(in))
	fr.SetMaxReadFrameSize(99)
	if _, err := fr.ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
	fr = NewFramer(nil, bytes.NewReader(in))
	fr.SetMaxReadFrameSize(100)
	if _, err := fr.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	fr.SetMaxReadFrameSize(^uint32(0))
	if fr.maxRead != MaxFrameSizeLimit {
		t.Fatalf("max %d not clamped to %d", fr.maxRead, MaxFrameSizeLimit)
	}
}

// allocatedBytes returns the bytes allocated while f runs.
func allocatedBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestReadFrameHugeLengthDoesNotAllocate(t *testing.T) {
	in := unhex(t, "ffffffff 0c 00 0000 00000001")
	fr := NewFramer(nil, bytes.NewReader(in))
	fr.SetMaxReadFrameSize(MaxFrameSizeLimit)
	var err error
	n := allocatedBytes(func() { _, err = fr.ReadFrame() })
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
	if n > 16<<10 { // less than readChunk: no payload buffer
		t.Fatalf("rejecting a 4 GiB header allocated %d bytes", n)
	}
}

func TestReadFrameAllocationBoundedByInput(t *testing.T) {
	// A 1 GiB frame is allowed, but only 100 bytes of it arrive.
	in := unhex(t, hdr(MaxFrameSizeLimit, 200, 0, 1)+strings.Repeat("00", 100))
	fr := NewFramer(nil, bytes.NewReader(in))
	fr.SetMaxReadFrameSize(MaxFrameSizeLimit)
	var err error
	n := allocatedBytes(func() { _, err = fr.ReadFrame() })
	if !errors.Is(err, ErrShortFrame) {
		t.Fatalf("got %v", err)
	}
	if n > 256<<10 {
		t.Fatalf("a truncated 1 GiB frame allocated %d bytes", n)
	}
}

func TestReadBufferReused(t *testing.T) {
	var buf bytes.Buffer
	fr := NewFramer(&buf, &buf)
	for i := range 3 {
		if err := fr.WriteFrame(200, 0, 1, bytes.Repeat([]byte{byte(i)}, 100<<10)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	first := f.(*UnknownFrame).Payload
	allocs := testing.AllocsPerRun(1, func() {
		if _, err := fr.ReadFrame(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 { // the *UnknownFrame itself
		t.Fatalf("%v allocations per frame, want the buffer reused", allocs)
	}
	// AllocsPerRun reads twice (warm-up and run): frames 1 and 2.
	if first[0] != 2 {
		t.Fatalf("the payload of an earlier frame was not overwritten; is the buffer reused?")
	}
}

func TestStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{FrameMessage.String(), "MESSAGE"},
		{FrameRelease.String(), "RELEASE"},
		{FrameType(12).String(), "UNKNOWN_FRAME_TYPE_12"}, // reserved
		{Flags(0).String(), "0"},
		{FlagEndStream.String(), "END_STREAM"},
		{Flags(0x81).String(), "END_STREAM|0x80"},
		{CodeOutOfRange.String(), "OutOfRange"},
		{ErrCode(99).String(), "ErrCode(99)"},
		{SystemPoison.String(), "Poison"},
		{SystemKind(0).String(), "SystemKind(0)"},
		{FrameHeader{5, FramePing, 1, 3}.String(), "[PING flags=END_STREAM stream=3 len=5]"},
		{(&ConnError{Code: CodeProtocol, Reason: "x", Err: ErrBadBody}).Error(), "wire: connection error Protocol: x: wire: bad frame body"},
		{(&StreamError{Stream: 4, Code: CodeReleased, Cause: io.EOF}).Error(), "wire: stream 4 error Released: EOF"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for ft := FrameHello; ft <= FrameMessages; ft++ {
		reserved := ft >= 11 && ft <= 13
		if strings.HasPrefix(ft.String(), "UNKNOWN") != reserved {
			t.Errorf("frame type %d: name %s", ft, ft)
		}
	}
	for c := CodeNoError; c <= CodeClosed; c++ {
		if strings.HasPrefix(c.String(), "ErrCode(") {
			t.Errorf("code %d has no name", c)
		}
	}
}

func TestErrorsUnwrap(t *testing.T) {
	se := &StreamError{Stream: 1, Code: CodeTimeout, Cause: &ConnError{Code: CodeProtocol, Err: ErrShortFrame}}
	var wrapped error = errors.Join(errors.New("outer"), se)
	if !errors.Is(wrapped, ErrShortFrame) {
		t.Fatal("errors.Is does not see the sentinel through StreamError and ConnError")
	}
	var got *StreamError
	if !errors.As(wrapped, &got) || got.Stream != 1 {
		t.Fatal("errors.As does not find the StreamError")
	}
}

func TestFrameErrors(t *testing.T) {
	ef := &ErrorFrame{FrameHeader{Stream: 3}, Error{Code: CodeNotFound, Stream: 3, Msg: "no export 9"}}
	se := ef.StreamError()
	if se.Stream != 3 || se.Code != CodeNotFound || se.Error() != "wire: stream 3 error NotFound: peer says: no export 9" {
		t.Fatalf("got %v", se)
	}
}

// A header of many entries or many bytes is refused before it is stored:
// a map of small entries costs far more memory than its bytes.
func TestMessageHeaderBounded(t *testing.T) {
	many := map[string]string{}
	for i := range MaxHeaderEntries + 1 {
		many[fmt.Sprint(i)] = ""
	}
	big := map[string]string{"a": strings.Repeat("x", MaxHeaderBytes/2), "b": strings.Repeat("y", MaxHeaderBytes/2)}
	ok := map[string]string{"trace": "00-abc", "k": "v"}
	for _, tc := range []struct {
		name string
		h    map[string]string
		bad  bool
	}{{"entries", many, true}, {"bytes", big, true}, {"protoactor's few", ok, false}} {
		b, err := EncodeMsgpack(&Message{Type: "t", Header: tc.h})
		if err != nil {
			t.Fatal(err)
		}
		var m Message
		err = decodeMessage(b, &m)
		switch {
		case tc.bad && (!errors.Is(err, ErrBadBody) || !errors.Is(err, errHeaderTooLarge)):
			t.Errorf("%s: %v, want a header too large", tc.name, err)
		case !tc.bad && (err != nil || len(m.Header) != len(tc.h)):
			t.Errorf("%s: %v, header %v", tc.name, err, m.Header)
		}
	}
}
