package pcitopo

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRankFixtures(t *testing.T) {
	for _, name := range []string{"dgx-h100.txt", "shared-4gpu-2nic.txt", "far-gpu.txt"} {
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, name)
			topo, err := Rank(fx.root, fx.gpus)
			if err != nil {
				t.Fatal(err)
			}
			if len(topo.GPUs) != len(fx.gpus) {
				t.Fatalf("%d GPUs, want %d", len(topo.GPUs), len(fx.gpus))
			}
			for i, g := range topo.GPUs {
				want := fx.want[fx.gpus[i]]
				if g.BusID != fx.gpus[i] {
					t.Errorf("GPU %d is %s, want %s", i, g.BusID, fx.gpus[i])
				}
				if len(g.NICs) != len(want) {
					t.Errorf("%s: %d NICs ranked, the fixture names %d", g.BusID, len(g.NICs), len(want))
				}
				for j, p := range g.NICs {
					if got := p.Class.String(); got != want[p.NIC] {
						t.Errorf("%s → %s: %s, want %s", g.BusID, p.NIC, got, want[p.NIC])
					}
					if j > 0 && p.Class.Better(g.NICs[j-1].Class) {
						t.Errorf("%s: %s (%s) ranked after %s (%s)", g.BusID, p.NIC, p.Class, g.NICs[j-1].NIC, g.NICs[j-1].Class)
					}
				}
				// The nearest are exactly the NICs of the best class named.
				var best []string
				for _, c := range []string{"PIX", "PXB", "PHB", "NODE", "SYS", "unknown"} {
					for n, wc := range want {
						if wc == c {
							best = append(best, n)
						}
					}
					if best != nil {
						break
					}
				}
				slices.Sort(best)
				var near []string
				for _, p := range g.Nearest() {
					near = append(near, p.NIC)
				}
				if !slices.Equal(near, best) {
					t.Errorf("%s: nearest %v, want %v", g.BusID, near, best)
				}
				// Choose takes the first usable in rank order: with the
				// nearest NICs unusable, a NIC of a farther class.
				if c, ok := g.Choose(func(string) bool { return true }); !ok || c != g.NICs[0] {
					t.Errorf("%s: chose %v, want %v", g.BusID, c, g.NICs[0])
				}
				if len(g.NICs) > len(near) {
					c, ok := g.Choose(func(n string) bool { return !slices.Contains(near, n) })
					if !ok || c != g.NICs[len(near)] {
						t.Errorf("%s: nearest unusable: chose %v, want %v", g.BusID, c, g.NICs[len(near)])
					}
				}
				if _, ok := g.Choose(func(string) bool { return false }); ok {
					t.Errorf("%s: chose a NIC with none usable", g.BusID)
				}
				if g.CrossSocketOnly() != fx.warns[g.BusID] {
					t.Errorf("%s: CrossSocketOnly %v, want %v", g.BusID, g.CrossSocketOnly(), fx.warns[g.BusID])
				}
			}
		})
	}
}

// TestDGXNUMANodes checks the NUMA nodes read from the fixture's sysfs.
func TestDGXNUMANodes(t *testing.T) {
	fx := loadFixture(t, "dgx-h100.txt")
	for i, bus := range fx.gpus {
		n, err := NUMANode(fx.root, bus)
		if err != nil {
			t.Fatal(err)
		}
		if want := i / 4; n != want {
			t.Errorf("GPU %s on node %d, want %d", bus, n, want)
		}
	}
	if OneNUMANode(fx.root) {
		t.Error("OneNUMANode true on a two-node host")
	}
	nics, err := NICs(fx.root)
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) != 8 {
		t.Fatalf("%d NICs, want 8", len(nics))
	}
	l := nics[0].Loc
	if nics[0].Name != "mlx5_0" || l.HostBridge != "pci0000:15" || l.Bus.String() != "0000:18:00.0" || len(l.Path) != 4 || l.NUMANode != 0 {
		t.Errorf("mlx5_0 at %+v", l)
	}
}

func TestOneNUMANode(t *testing.T) {
	root := t.TempDir()
	if !OneNUMANode(root) {
		t.Error("no node directory (a kernel without NUMA): want one node")
	}
	dir := filepath.Join(root, "sys", "devices", "system", "node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if OneNUMANode(root) {
		t.Error("node directory without online: unknown, want false")
	}
	for online, want := range map[string]bool{"0\n": true, "1": true, "0-1\n": false, "0,2": false, "": false} {
		if err := os.WriteFile(filepath.Join(dir, "online"), []byte(online), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := OneNUMANode(root); got != want {
			t.Errorf("online %q: %v, want %v", online, got, want)
		}
	}
}

func loc(hb string, numa int, path ...string) Location {
	l := Location{HostBridge: hb, NUMANode: numa}
	for _, p := range path {
		id, err := ParseBusID(p)
		if err != nil {
			panic(err)
		}
		l.Path = append(l.Path, id)
	}
	if len(l.Path) > 0 {
		l.Bus = l.Path[len(l.Path)-1]
	}
	return l
}

func TestDistance(t *testing.T) {
	gpu := loc("pci0000:00", 0, "00:01.0", "01:00.0", "02:00.0", "03:00.0")
	for _, tc := range []struct {
		name    string
		a, b    Location
		oneNode bool
		want    Class
	}{
		{"same switch", gpu, loc("pci0000:00", 0, "00:01.0", "01:00.0", "02:01.0", "04:00.0"), false, ClassPIX},
		{"functions of one device", gpu, loc("pci0000:00", 0, "00:01.0", "01:00.0", "02:00.0", "03:00.1"), false, ClassPIX},
		{"switch below the shared one", gpu, loc("pci0000:00", 0, "00:01.0", "01:00.0", "02:01.0", "04:00.0", "05:00.0", "06:00.0"), false, ClassPXB},
		{"same root port, on it directly", loc("pci0000:00", 0, "00:01.0", "01:00.0"), loc("pci0000:00", 0, "00:01.0", "01:00.1"), false, ClassPIX},
		{"other root port", gpu, loc("pci0000:00", 0, "00:03.0", "05:00.0"), false, ClassPHB},
		{"flat root bus (a VM)", loc("pci0000:00", -1, "00:04.0"), loc("pci0000:00", -1, "00:05.0"), false, ClassPHB},
		{"other host bridge, same node", gpu, loc("pci0000:40", 0, "40:01.0", "41:00.0"), false, ClassNode},
		{"other host bridge, other node", gpu, loc("pci0000:80", 1, "80:01.0", "81:00.0"), false, ClassSys},
		{"node unknown, one node", loc("pci0000:00", -1, "00:01.0"), loc("pci0000:40", -1, "40:01.0"), true, ClassNode},
		{"node unknown, several nodes", loc("pci0000:00", -1, "00:01.0"), loc("pci0000:40", 1, "40:01.0"), false, ClassUnknown},
		{"not located", gpu, Location{}, false, ClassUnknown},
	} {
		if got := Distance(tc.a, tc.b, tc.oneNode); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		if got := Distance(tc.b, tc.a, tc.oneNode); got != tc.want {
			t.Errorf("%s (reversed): %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestClassOrder(t *testing.T) {
	order := []Class{ClassPIX, ClassPXB, ClassPHB, ClassNode, ClassSys, ClassUnknown}
	for i := range order {
		for j := range order {
			if got := order[i].Better(order[j]); got != (i < j) {
				t.Errorf("%s.Better(%s) = %v", order[i], order[j], got)
			}
		}
	}
	if s := Class(42).String(); s != "Class(42)" {
		t.Errorf("invalid class prints %q", s)
	}
	if ClassUnknown.Better(Class(42)) || Class(42).Better(ClassSys) {
		t.Error("an invalid class must rank with unknown")
	}
}

// TestBadSysfs: missing and malformed entries give errors or unknown
// classes, never a panic.
func TestBadSysfs(t *testing.T) {
	fx := loadFixture(t, "shared-4gpu-2nic.txt")
	sys := filepath.Join(fx.root, "sys")
	devs := filepath.Join(sys, "bus", "pci", "devices")
	// A NIC whose device link dangles, one that points outside the PCI
	// tree, a GPU link into a non-PCI directory, garbage in a numa_node.
	ib := filepath.Join(sys, "class", "infiniband")
	mk := func(dir string) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk(filepath.Join(ib, "dangling"))
	if err := os.Symlink("../../../nowhere", filepath.Join(ib, "dangling", "device")); err != nil {
		t.Fatal(err)
	}
	mk(filepath.Join(ib, "outside"))
	if err := os.Symlink(fx.root, filepath.Join(ib, "outside", "device")); err != nil {
		t.Fatal(err)
	}
	mk(filepath.Join(sys, "devices", "platform", "gpu0"))
	if err := os.Symlink("../../../devices/platform/gpu0", filepath.Join(devs, "0000:40:00.0")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(devs, "0000:04:00.0", "numa_node"), []byte("zero\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	topo, err := Rank(fx.root, []string{"0000:03:00.0", "0000:04:00.0", "0000:99:00.0", "0000:40:00.0", "not a bus id"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range topo.NICs {
		switch n.Name {
		case "dangling", "outside", "rxe0":
			if n.Err == nil || !strings.Contains(n.Err.Error(), n.Name) {
				t.Errorf("%s: error %v, want one naming it", n.Name, n.Err)
			}
		default:
			if n.Err != nil {
				t.Errorf("%s: %v", n.Name, n.Err)
			}
		}
	}
	g := topo.GPUs
	if g[0].Err != nil || g[0].NICs[0] != (Path{"mlx5_0", ClassPIX}) {
		t.Errorf("good GPU: %v %v", g[0].Err, g[0].NICs)
	}
	for _, p := range g[0].NICs[2:] {
		if p.Class != ClassUnknown {
			t.Errorf("%s: %s, want unknown", p.NIC, p.Class)
		}
	}
	// A malformed numa_node reads as unknown; one NUMA node here, so the
	// classes stand.
	if g[1].Err != nil || g[1].Loc.NUMANode != -1 || g[1].NICs[0] != (Path{"mlx5_0", ClassPIX}) {
		t.Errorf("GPU with a bad numa_node: %v %+v %v", g[1].Err, g[1].Loc, g[1].NICs)
	}
	for i, want := range []string{"0000:99:00.0", "0000:40:00.0", "not a bus id"} {
		gg := g[2+i]
		if gg.Err == nil || !strings.Contains(gg.Err.Error(), want) {
			t.Errorf("GPU %s: error %v, want one naming it", want, gg.Err)
		}
		for _, p := range gg.NICs {
			if p.Class != ClassUnknown {
				t.Errorf("GPU %s → %s: %s, want unknown", want, p.NIC, p.Class)
			}
		}
		if len(gg.Nearest()) != len(topo.NICs) || gg.CrossSocketOnly() {
			t.Errorf("GPU %s: nearest %v", want, gg.Nearest())
		}
	}
	if !errors.Is(g[4].Err, ErrBadBusID) {
		t.Errorf("malformed bus id: %v, want ErrBadBusID", g[4].Err)
	}
	if _, err := NUMANode(fx.root, "0000:99:00.0"); err == nil {
		t.Error("NUMANode of an absent device: no error")
	}

	// A file where the class directory should be: the list cannot be read.
	bad := t.TempDir()
	mk(filepath.Join(bad, "sys", "class"))
	if err := os.WriteFile(filepath.Join(bad, "sys", "class", "infiniband"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Rank(bad, nil); err == nil {
		t.Error("unreadable infiniband class: no error")
	}
	// No RDMA device at all: an empty ranking, no error.
	topo, err = Rank(t.TempDir(), []string{"0000:03:00.0"})
	if err != nil || len(topo.NICs) != 0 || len(topo.GPUs[0].NICs) != 0 || topo.GPUs[0].Nearest() != nil {
		t.Errorf("no sysfs: %v %+v", err, topo)
	}
}

// TestLiveSysfs reads this machine's tree: whatever it holds, every PCI
// device locates below a host bridge.
func TestLiveSysfs(t *testing.T) {
	ents, err := os.ReadDir("/sys/bus/pci/devices")
	if err != nil || len(ents) == 0 {
		t.Skipf("no PCI devices in sysfs here: %v", err)
	}
	for _, e := range ents {
		id, err := ParseBusID(e.Name())
		if err != nil {
			t.Fatalf("sysfs name %q: %v", e.Name(), err)
		}
		l, err := Locate("/", id)
		if err != nil {
			t.Fatal(err)
		}
		if l.Bus != id || !strings.HasPrefix(l.HostBridge, "pci") {
			t.Errorf("%s located at %+v", id, l)
		}
	}
	if _, err := Rank("", nil); err != nil {
		t.Fatal(err)
	}
}
