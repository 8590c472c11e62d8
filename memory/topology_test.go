package memory

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

func TestHostIDStable(t *testing.T) {
	t.Setenv(HostIDEnv, "")
	a, b := HostID(), HostID()
	if a == "" || a != b || len(a) != 16 {
		t.Fatalf("HostID = %q then %q", a, b)
	}
	// Another process on the same host agrees.
	if os.Getenv("TF_HOSTID_CHILD") == "1" {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHostIDChild$", "-test.v")
	cmd.Env = append(os.Environ(), "TF_HOSTID_CHILD=1", HostIDEnv+"=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "hostid="+a) {
		t.Errorf("child process disagrees: %s", out)
	}
	t.Setenv(HostIDEnv, "pretend-host-2")
	if HostID() != "pretend-host-2" {
		t.Error("override ignored")
	}
	if hashID("boot_id", "x") == hashID("boot_id", "y") {
		t.Error("different hosts hash alike")
	}
}

func TestHostIDChild(t *testing.T) {
	if os.Getenv("TF_HOSTID_CHILD") != "1" {
		t.Skip("helper for TestHostIDStable")
	}
	t.Logf("hostid=%s", HostID())
}

func TestNUMANodeParsing(t *testing.T) {
	if n := numaNode("not a bus id"); n != -1 {
		t.Errorf("numaNode(garbage) = %d", n)
	}
	if n := numaNode("00000000:ff:1f.7"); n != -1 {
		t.Errorf("numaNode(absent device) = %d", n)
	}
}

func TestTopology(t *testing.T) {
	topo, err := Topology()
	if topo.HostID != HostID() {
		t.Errorf("HostID = %q", topo.HostID)
	}
	if err != nil {
		if !errors.Is(err, ErrNotSupported) || len(topo.GPUs) != 0 {
			t.Fatalf("Topology() = %+v, %v", topo, err)
		}
		t.Skipf("no NVML (GPU part skipped): %v", err)
	}
	if len(topo.GPUs) == 0 {
		t.Skip("NVML sees no GPU")
	}
	for i, g := range topo.GPUs {
		t.Logf("%+v", g)
		if g.Index != i || !strings.HasPrefix(g.UUID, "GPU-") || g.BAR1Total == 0 || g.NUMANode < -1 {
			t.Errorf("GPU %d: %+v", i, g)
		}
	}
	if len(topo.P2P) != len(topo.GPUs) {
		t.Errorf("P2P has %d rows for %d GPUs", len(topo.P2P), len(topo.GPUs))
	}
	t.Logf("P2P %+v", topo.P2P)
	if os.Getenv("CUDA_VISIBLE_DEVICES") == "" {
		if uuid, err := cuda.DeviceUUID(0); err == nil {
			found := false
			for _, g := range topo.GPUs {
				found = found || g.UUID == uuid
			}
			if !found {
				t.Errorf("CUDA device 0 (%s) is not in the NVML topology", uuid)
			}
		}
	}
}
