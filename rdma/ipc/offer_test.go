package ipc

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func TestOfferBytes(t *testing.T) {
	o := offer{Alloc: 0x0102030405060708, Offset: 0x1000, Bytes: 0x20, AllocSize: 0x2000, Flags: flagDirect, Deadline: 0x1122334455667788}
	want, _ := hex.DecodeString("02" + "0807060504030201" + "0010000000000000" + "2000000000000000" + "0020000000000000" + "01" + "8877665544332211")
	got := o.encode()
	if !bytes.Equal(got, want) {
		t.Fatalf("encode: %x, want %x", got, want)
	}
	back, err := decodeOffer(got)
	if err != nil || back != o {
		t.Fatalf("decode: %+v, %v; want %+v", back, err, o)
	}
}

func TestDecodeOfferRejects(t *testing.T) {
	good := offer{Alloc: 1, Offset: 8, Bytes: 8, AllocSize: 16}.encode()
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":           nil,
		"short":           good[:offerLen-1],
		"long":            append(bytes.Clone(good), 0),
		"version":         mod(func(b []byte) []byte { b[0] = 1; return b }),
		"unknown-flag":    mod(func(b []byte) []byte { b[33] = 2; return b }),
		"offset-past-end": offer{Alloc: 1, Offset: 17, Bytes: 0, AllocSize: 16}.encode(),
		"bytes-past-end":  offer{Alloc: 1, Offset: 8, Bytes: 9, AllocSize: 16}.encode(),
		"overflow":        offer{Alloc: 1, Offset: 8, Bytes: ^uint64(0) - 4, AllocSize: 16}.encode(),
		"huge-alloc":      offer{Alloc: 1, Offset: 0, Bytes: 1, AllocSize: maxAllocSize + 1}.encode(),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeOffer(b); !errors.Is(err, errBadMessage) {
				t.Fatalf("decodeOffer(%x): %v, want errBadMessage", b, err)
			}
		})
	}
	if _, err := decodeOffer(offer{Alloc: 1, Offset: 16, Bytes: 0, AllocSize: 16}.encode()); err != nil {
		t.Fatalf("empty range at the end: %v", err)
	}
}

func FuzzDecodeOffer(f *testing.F) {
	f.Add(offer{Alloc: 1, Offset: 8, Bytes: 8, AllocSize: 16}.encode())
	f.Add(offer{Alloc: 7, Offset: 0, Bytes: 0, AllocSize: 0}.encode())
	f.Add(offer{Offset: 1 << 40, Bytes: 1 << 40, AllocSize: maxAllocSize}.encode())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decodeOffer(b)
		if err != nil {
			return
		}
		if o.AllocSize > maxAllocSize || o.Offset+o.Bytes > o.AllocSize {
			t.Fatalf("accepted an offer outside its allocation: %+v", o)
		}
		if !bytes.Equal(o.encode(), b) {
			t.Fatalf("re-encoding %+v gives %x, not %x", o, o.encode(), b)
		}
	})
}
