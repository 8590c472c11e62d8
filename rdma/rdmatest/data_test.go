package rdmatest

import (
	"bytes"
	"testing"
)

func TestFillIsCutIndependent(t *testing.T) {
	whole := make([]byte, 1000)
	Fill(9, whole)
	for _, cut := range [][2]int{{0, 1}, {3, 11}, {8, 16}, {13, 999}, {999, 1000}, {5, 5}} {
		p := make([]byte, cut[1]-cut[0])
		FillAt(9, int64(cut[0]), p)
		if !bytes.Equal(p, whole[cut[0]:cut[1]]) {
			t.Errorf("FillAt(%d, %d bytes) differs from Fill", cut[0], len(p))
		}
	}
	other := make([]byte, 1000)
	Fill(10, other)
	if bytes.Equal(other, whole) {
		t.Error("different seeds give the same data")
	}
}

func TestVerify(t *testing.T) {
	got := make([]byte, 100)
	Fill(1, got[:90])
	poison(got[90:])
	if err := verify(got, 1, 90); err != nil {
		t.Fatal(err)
	}
	if err := verify(got, 2, 90); err == nil {
		t.Error("wrong data accepted")
	}
	got[95] = 0
	if err := verify(got, 1, 90); err == nil {
		t.Error("overwritten tail accepted")
	}
	if err := verify(got, 1, 101); err == nil {
		t.Error("short destination accepted")
	}
}
