package staging

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/wire"
)

func TestFrameExactBytes(t *testing.T) {
	tests := []struct {
		name  string
		write func(f *Framer) error
		hex   string
	}{
		{"request", func(f *Framer) error {
			return f.WriteRequest(7, Request{ExportID: 1, Lease: 0x0102030405060708, Incarnation: 3, Offset: 4, Length: 5, ChunkSize: 6, Window: 9})
		}, "01000000" + "00000007" + "0000000000000030" +
			"0000000000000001" + "0102030405060708" + "0000000000000003" + "0000000000000004" + "0000000000000005" + "00000006" + "00000009"},
		{"data", func(f *Framer) error { return f.WriteData(1, 0x10, []byte{0xaa, 0xbb}) },
			"02000000" + "00000001" + "000000000000000a" + "0000000000000010" + "aabb"},
		{"end", func(f *Framer) error { return f.WriteStatus(FrameEnd, 2, Status{Code: wire.CodeNoError}) },
			"03000000" + "00000002" + "0000000000000004" + "00000000"},
		{"error", func(f *Framer) error {
			return f.WriteStatus(FrameError, 2, Status{Code: wire.CodeReleased, Message: "no"})
		}, "04000000" + "00000002" + "0000000000000006" + "00000008" + "6e6f"},
		{"error with a code from a later version", func(f *Framer) error {
			return f.WriteStatus(FrameError, 2, Status{Code: 0x01020304})
		}, "04000000" + "00000002" + "0000000000000004" + "01020304"},
		{"cancel", func(f *Framer) error { return f.WriteCancel(0xffffffff) },
			"05000000" + "ffffffff" + "0000000000000000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tc.write(NewFramer(nil, &buf, 0)); err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(buf.Bytes()); got != tc.hex {
				t.Fatalf("bytes\n got %s\nwant %s", got, tc.hex)
			}
			// Read it back and write it again: the same bytes.
			f := NewFramer(bytes.NewReader(buf.Bytes()), nil, 0)
			fr, err := f.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			var again bytes.Buffer
			if err := rewrite(NewFramer(nil, &again, 0), fr); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Bytes(), buf.Bytes()) {
				t.Fatalf("round trip\n got %x\nwant %x", again.Bytes(), buf.Bytes())
			}
			if _, err := f.ReadFrame(); err != io.EOF {
				t.Fatalf("after the frame: %v, want io.EOF", err)
			}
		})
	}
}

func rewrite(f *Framer, fr Frame) error {
	switch fr.Type {
	case FrameRequest:
		return f.WriteRequest(fr.Stream, fr.Request)
	case FrameData:
		return f.WriteData(fr.Stream, fr.Offset, fr.Data)
	case FrameEnd, FrameError:
		return f.WriteStatus(fr.Type, fr.Stream, fr.Status)
	case FrameCancel:
		return f.WriteCancel(fr.Stream)
	}
	return errors.New("unknown frame")
}

func header(typ byte, reserved uint16, length uint64) []byte {
	b := make([]byte, HeaderSize)
	b[0] = typ
	b[2], b[3] = byte(reserved>>8), byte(reserved)
	for i := range 8 {
		b[8+i] = byte(length >> (56 - 8*i))
	}
	return b
}

func TestReadFrameRejects(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"unknown type", header(9, 0, 0), ErrBadFrame},
		{"type zero", header(0, 0, 0), ErrBadFrame},
		{"reserved bits", header(byte(FrameCancel), 1, 0), ErrBadFrame},
		{"flags", append([]byte{byte(FrameCancel), 1}, header(0, 0, 0)[2:]...), ErrBadFrame},
		{"short request", header(byte(FrameRequest), 0, RequestSize-1), ErrBadFrame},
		{"long request", header(byte(FrameRequest), 0, RequestSize+1), ErrBadFrame},
		{"data without offset", header(byte(FrameData), 0, 7), ErrBadFrame},
		{"data above chunk limit", header(byte(FrameData), 0, 8+1024+1), ErrFrameTooLarge},
		{"data of 2^64-1 bytes", header(byte(FrameData), 0, ^uint64(0)), ErrFrameTooLarge},
		{"end without code", header(byte(FrameEnd), 0, 3), ErrBadFrame},
		{"error message too long", header(byte(FrameError), 0, statusCodeSize+MaxMessage+1), ErrFrameTooLarge},
		{"cancel with body", header(byte(FrameCancel), 0, 1), ErrBadFrame},
		{"truncated header", header(byte(FrameEnd), 0, 2)[:10], io.ErrUnexpectedEOF},
		{"truncated body", append(header(byte(FrameEnd), 0, 5), 0, 0, 'a'), io.ErrUnexpectedEOF},
		{"truncated data", append(header(byte(FrameData), 0, 12), 0, 0, 0, 0, 0, 0, 0, 0, 1), io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFramer(bytes.NewReader(tc.in), nil, 1024)
			_, err := f.ReadFrame()
			if !errors.Is(err, tc.want) {
				t.Fatalf("ReadFrame: %v, want %v", err, tc.want)
			}
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !strings.HasPrefix(err.Error(), "staging: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestWriteLimits(t *testing.T) {
	f := NewFramer(nil, io.Discard, 16)
	if err := f.WriteData(1, 0, make([]byte, 17)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversized DATA: %v", err)
	}
	if err := f.WriteStatus(FrameData, 1, Status{}); !errors.Is(err, ErrBadFrame) {
		t.Errorf("status in a DATA frame: %v", err)
	}
	var buf bytes.Buffer
	f = NewFramer(nil, &buf, 0)
	if err := f.WriteStatus(FrameError, 1, Status{Code: wire.CodeInternal, Message: strings.Repeat("x", 5000)}); err != nil {
		t.Fatal(err)
	}
	fr, err := NewFramer(&buf, nil, 0).ReadFrame()
	if err != nil || len(fr.Status.Message) != MaxMessage {
		t.Fatalf("long message: %v, %d bytes", err, len(fr.Status.Message))
	}
}

func TestStrings(t *testing.T) {
	for ft := FrameType(0); ft < 7; ft++ {
		if ft.String() == "" {
			t.Errorf("FrameType(%d) has no name", ft)
		}
	}
	if FrameData.String() != "DATA" || FrameType(9).String() != "FrameType(9)" {
		t.Errorf("frame type names: %v %v", FrameData, FrameType(9))
	}
}

// FuzzReadFrame reads frames from arbitrary bytes: it must never panic, and
// it never allocates more than the chunk limit however large a length field
// claims to be.
func FuzzReadFrame(f *testing.F) {
	for _, seed := range [][]byte{
		header(byte(FrameCancel), 0, 0),
		append(header(byte(FrameEnd), 0, 6), 0, 0, 0, 1, 'h', 'i'),
		append(header(byte(FrameData), 0, 10), 0, 0, 0, 0, 0, 0, 0, 5, 1, 2),
		append(header(byte(FrameRequest), 0, RequestSize), make([]byte, RequestSize)...),
		header(byte(FrameData), 0, 1<<62),
	} {
		f.Add(seed)
	}
	const limit = 4096
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<20 {
			return
		}
		fr := NewFramer(bytes.NewReader(in), nil, limit)
		for range 64 {
			frame, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if cap(fr.data) > limit || len(frame.Data) > limit {
				t.Fatalf("framer holds %d bytes > limit %d", cap(fr.data), limit)
			}
			if len(frame.Status.Message) > MaxMessage {
				t.Fatalf("message of %d bytes", len(frame.Status.Message))
			}
			// Whatever was read can be written back and read again equal.
			var buf bytes.Buffer
			if err := rewrite(NewFramer(nil, &buf, limit), frame); err != nil {
				t.Fatalf("rewrite %v: %v", frame.Type, err)
			}
			back, err := NewFramer(&buf, nil, limit).ReadFrame()
			if err != nil {
				t.Fatalf("reread %v: %v", frame.Type, err)
			}
			if back.Header != frame.Header || back.Request != frame.Request || back.Status != frame.Status || back.Offset != frame.Offset || !bytes.Equal(back.Data, frame.Data) {
				t.Fatalf("round trip changed the frame: %+v -> %+v", frame, back)
			}
		}
	})
}
