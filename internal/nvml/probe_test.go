package nvml

import (
	"errors"
	"testing"
)

func TestProbe(t *testing.T) {
	s, err := Probe()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Probe() = %v, want nil or ErrUnavailable", err)
		}
		if len(s.GPUs) != 0 || len(s.P2P) != 0 {
			t.Errorf("failed Probe returned GPUs: %+v", s)
		}
		t.Skipf("NVML unavailable (GPU part of the test skipped): %v", err)
	}
	t.Logf("driver %s, %d GPU(s)", s.DriverVersion, len(s.GPUs))
	if len(s.P2P) != len(s.GPUs) {
		t.Fatalf("P2P matrix has %d rows for %d GPUs", len(s.P2P), len(s.GPUs))
	}
	for i, g := range s.GPUs {
		t.Logf("%+v", g)
		if g.Index != i || len(g.UUID) < 10 || g.UUID[:4] != "GPU-" || g.PCIBusID == "" || g.MemoryTotal == 0 {
			t.Errorf("GPU %d: %+v", i, g)
		}
		if g.BAR1Total == 0 || g.BAR1Used > g.BAR1Total {
			t.Errorf("GPU %d BAR1 %d used of %d", i, g.BAR1Used, g.BAR1Total)
		}
		for j, l := range s.P2P[i] {
			if i != j && !l.Read && l.Reason == "" {
				t.Errorf("P2P %d->%d unsupported without a reason", i, j)
			}
			t.Logf("P2P %d->%d: %+v", i, j, l)
		}
	}
}
