package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/shm"
)

// sysfsTree writes a two-socket sysfs: a GPU on socket 1 at 0000:81:00.0,
// the only NIC (mlx5_0) on socket 0.
func sysfsTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	sys := filepath.Join(root, "sys")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	gpu := filepath.Join(sys, "devices", "pci0000:80", "0000:80:01.0", "0000:81:00.0")
	nic := filepath.Join(sys, "devices", "pci0000:00", "0000:00:01.0", "0000:01:00.0")
	for _, d := range []string{gpu, filepath.Join(nic, "infiniband", "mlx5_0"), filepath.Join(sys, "bus", "pci", "devices"),
		filepath.Join(sys, "class", "infiniband"), filepath.Join(sys, "devices", "system", "node")} {
		must(os.MkdirAll(d, 0o755))
	}
	must(os.WriteFile(filepath.Join(gpu, "numa_node"), []byte("1\n"), 0o644))
	must(os.WriteFile(filepath.Join(nic, "numa_node"), []byte("0\n"), 0o644))
	must(os.WriteFile(filepath.Join(sys, "devices", "system", "node", "online"), []byte("0-1\n"), 0o644))
	must(os.Symlink("../../../devices/pci0000:80/0000:80:01.0/0000:81:00.0", filepath.Join(sys, "bus", "pci", "devices", "0000:81:00.0")))
	must(os.Symlink("../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0", filepath.Join(sys, "class", "infiniband", "mlx5_0")))
	must(os.Symlink("../../../0000:01:00.0", filepath.Join(nic, "infiniband", "mlx5_0", "device")))
	return root
}

func TestTopoNICs(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"topo", "--config", "../../config/testdata/local3.yaml", "--sysfs", sysfsTree(t), "--gpus", "00000000:81:00.0, 0000:99:00.0"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("code %d: %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{
		"OWNER", // the channel table is still there
		"GPU  BUS ID            NUMA  NIC     CLASS    NEAREST",
		"0    00000000:81:00.0  1     mlx5_0  SYS      mlx5_0",
		"1    0000:99:00.0      ?     mlx5_0  unknown  mlx5_0",
		"warning: GPU 0 (00000000:81:00.0): every path to a NIC crosses sockets (SYS)",
		"warning: GPU 1 (0000:99:00.0): distance to the NICs unknown: pcitopo: PCI device 0000:99:00.0",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("topo output lacks %q:\n%s", want, s)
		}
	}
	// A GPU whose node is unknown on a two-node host: every class unknown.
	root := sysfsTree(t)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "sys", "devices", "pci0000:80", "0000:80:01.0", "0000:81:00.0", "numa_node"), []byte("-1\n"), 0o644))
	out.Reset()
	if code := run([]string{"topo", "--config", "../../config/testdata/local3.yaml", "--sysfs", root, "--gpus", "0000:81:00.0"}, &out, &errOut); code != 0 {
		t.Fatalf("code %d: %s", code, errOut.String())
	}
	s = out.String()
	for _, want := range []string{
		"0    0000:81:00.0  ?     mlx5_0  unknown  mlx5_0",
		"note: GPU 0 (0000:81:00.0): distance to every NIC unknown",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("topo output lacks %q:\n%s", want, s)
		}
	}
}

// TestPrintNICs: the chosen NIC is the nearest usable one; a chosen NIC
// across sockets with nearer ones unusable is warned about; none usable
// prints none.
func TestPrintNICs(t *testing.T) {
	topo := pcitopo.Topology{
		NICs: []pcitopo.NIC{{Name: "mlx5_0"}, {Name: "mlx5_1"}, {Name: "mlx5_4"}},
		GPUs: []pcitopo.GPU{
			{BusID: "0000:1b:00.0", Loc: pcitopo.Location{NUMANode: 0}, NICs: []pcitopo.Path{
				{NIC: "mlx5_0", Class: pcitopo.ClassPIX}, {NIC: "mlx5_1", Class: pcitopo.ClassPIX}, {NIC: "mlx5_4", Class: pcitopo.ClassSys}}},
			{BusID: "0000:43:00.0", Loc: pcitopo.Location{NUMANode: 0}, NICs: []pcitopo.Path{
				{NIC: "mlx5_1", Class: pcitopo.ClassNode}, {NIC: "mlx5_4", Class: pcitopo.ClassSys}}},
		},
	}
	var out bytes.Buffer
	usable := func(n string) bool { return n == "mlx5_4" || n == "mlx5_1" }
	if err := printNICs(&out, []gpuRow{{0, "0000:1b:00.0"}, {1, "0000:43:00.0"}}, topo, usable); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"0    0000:1b:00.0  0     mlx5_1  PIX    mlx5_0,mlx5_1",
		"1    0000:43:00.0  0     mlx5_1  NODE   mlx5_1",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "warning") {
		t.Errorf("a warning with a near NIC usable:\n%s", s)
	}
	out.Reset()
	if err := printNICs(&out, []gpuRow{{0, "0000:1b:00.0"}, {1, "0000:43:00.0"}}, topo, func(n string) bool { return n == "mlx5_4" }); err != nil {
		t.Fatal(err)
	}
	s = out.String()
	for _, want := range []string{
		"0    0000:1b:00.0  0     mlx5_4  SYS    mlx5_0,mlx5_1",
		"warning: GPU 0 (0000:1b:00.0): no NIC of its nearest class has a usable port; mlx5_4 crosses sockets (SYS)",
		"warning: GPU 1 (0000:43:00.0): no NIC of its nearest class has a usable port; mlx5_4 crosses sockets (SYS)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	out.Reset()
	if err := printNICs(&out, []gpuRow{{0, "0000:1b:00.0"}, {1, "0000:43:00.0"}}, topo, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "0    0000:1b:00.0  0     none  -      mlx5_0,mlx5_1") {
		t.Errorf("no usable NIC:\n%s", s)
	}
}

// Under gossip, topo names the mesh_only nodes and how they are kept.
func TestTopoMeshOnly(t *testing.T) {
	cfg, err := config.LocalConfig("mixed", 3)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printControl(&out, cfg, probeLocal(), shm.Config{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "MESH ONLY") {
		t.Fatalf("a mesh cluster has no mesh_only line:\n%s", out.String())
	}
	cfg.Membership = config.MembershipGossip
	cfg.Nodes[2].MeshOnly = true
	cfg.Nodes[2].GossipAddress = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := printControl(&out, cfg, probeLocal(), shm.Config{}); err != nil {
		t.Fatal(err)
	}
	want := cfg.Nodes[2].Name + ": not in gossip"
	if !strings.Contains(out.String(), "MESH ONLY") || !strings.Contains(out.String(), want) {
		t.Fatalf("topo output lacks %q:\n%s", want, out.String())
	}
}
