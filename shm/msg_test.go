package shm

import (
	"bytes"
	"strings"
	"testing"
)

func TestMsgRoundTrip(t *testing.T) {
	for _, m := range []msg{
		{kind: msgOffer, ok: true, nonce: [nonceSize]byte{9, 8, 7}, host: "21a62dc8-fbbc-488b-bd63-12e90d89b1ac"},
		{kind: msgAccept, ok: true, nonce: [nonceSize]byte{1}, ringSize: DefaultRingSize, name: namePrefix + strings.Repeat("ab", 16)},
		{kind: msgConfirm, reason: "could not map"},
		{kind: msgStart, ok: true},
	} {
		b := appendMsg(nil, &m)
		got, err := readMsg(bytes.NewReader(b), m.kind)
		if err != nil || got != m {
			t.Errorf("%s: got %+v, %v", msgNames[m.kind], got, err)
		}
	}
	long := msg{kind: msgConfirm, reason: strings.Repeat("x", 1000)}
	got, err := readMsg(bytes.NewReader(appendMsg(nil, &long)), msgConfirm)
	if err != nil || len(got.reason) != maxMsgString {
		t.Errorf("long reason: %d bytes, %v", len(got.reason), err)
	}
}

func TestMsgMalformed(t *testing.T) {
	good := appendMsg(nil, &msg{kind: msgOffer, ok: true, host: "h"})
	for name, b := range map[string][]byte{
		"magic":      append([]byte("XXXX"), good[4:]...),
		"too long":   append([]byte("TFSM\xff\xff"), good[6:]...),
		"truncated":  good[:len(good)-1],
		"kind":       func() []byte { b := bytes.Clone(good); b[6] = 9; return b }(),
		"ok byte":    func() []byte { b := bytes.Clone(good); b[7] = 2; return b }(),
		"wrong kind": appendMsg(nil, &msg{kind: msgStart}),
		"trailing": func() []byte {
			b := append(bytes.Clone(good), 0)
			b[5]++
			return b
		}(),
		"empty": nil,
	} {
		if _, err := readMsg(bytes.NewReader(b), msgOffer); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
