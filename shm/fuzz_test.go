package shm

import (
	"bytes"
	"testing"
)

// FuzzReadMsg: the upgrade's decoder never panics, reads at most
// maxMsgSize bytes, and what it accepts encodes back to the same message.
func FuzzReadMsg(f *testing.F) {
	f.Add(appendMsg(nil, &msg{kind: msgOffer, ok: true, host: "boot", nonce: [nonceSize]byte{1}}))
	f.Add(appendMsg(nil, &msg{kind: msgAccept, ok: true, ringSize: DefaultRingSize, name: namePrefix + "00112233445566778899aabbccddeeff"}))
	f.Add(appendMsg(nil, &msg{kind: msgConfirm, reason: "no"}))
	f.Add([]byte("TFSM\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for want := msgOffer; want <= msgStart; want++ {
			r := bytes.NewReader(b)
			m, err := readMsg(r, want)
			if read := len(b) - r.Len(); read > maxMsgSize {
				t.Fatalf("read %d bytes", read)
			}
			if err != nil {
				continue
			}
			again, err := readMsg(bytes.NewReader(appendMsg(nil, &m)), want)
			if err != nil || again != m {
				t.Fatalf("round trip: %+v became %+v, %v", m, again, err)
			}
		}
	})
}

// FuzzParseHeader: a header page from the peer is accepted only with the
// magic, the version and a valid ring size.
func FuzzParseHeader(f *testing.F) {
	page := make([]byte, hdrEnd)
	writeHeader(page, header{ringSize: DefaultRingSize})
	f.Add(page)
	f.Add([]byte(headerMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		if checkRingSize(uint64(h.ringSize)) != nil {
			t.Fatalf("accepted ring size %d", h.ringSize)
		}
	})
}
