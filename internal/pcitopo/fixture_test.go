package pcitopo

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fixture is a sysfs tree expanded from a compact description
// (testdata/*.txt), with what the test expects of it.
type fixture struct {
	root  string
	gpus  []string                     // bus ids as the want lines name them
	want  map[string]map[string]string // gpu → nic → class
	warns map[string]bool              // gpus whose only paths cross sockets
}

// loadFixture expands a description into a temporary sysfs laid out like
// the kernel's: every PCI device a directory under sys/devices nested
// below its bridges, with a numa_node file; sys/bus/pci/devices/<id> a
// relative link to it; an RDMA device a directory <pci device>/infiniband/
// <name> linked from sys/class/infiniband/<name>, with a device link back.
//
// Lines: "nodes N" (sys/devices/system/node/online), "gpu NUMA PATH",
// "nic NAME NUMA PATH", "soft NAME" (an RDMA device with no PCI function,
// as soft-RoCE registers), "want GPU CLASS NIC..." and "warn GPU".
func loadFixture(t *testing.T, name string) fixture {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fx := fixture{root: t.TempDir(), want: map[string]map[string]string{}, warns: map[string]bool{}}
	sys := filepath.Join(fx.root, "sys")
	mkdir := func(p string) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, at string) {
		mkdir(filepath.Dir(at))
		if _, err := os.Lstat(at); err == nil {
			return
		}
		if err := os.Symlink(target, at); err != nil {
			t.Fatal(err)
		}
	}
	mkdir(filepath.Join(sys, "devices"))
	mkdir(filepath.Join(sys, "bus", "pci", "devices"))
	// device creates the PCI devices of path and returns the last one's
	// directory.
	device := func(numa, path string) string {
		parts := strings.Split(path, "/")
		dir := filepath.Join(sys, "devices", parts[0])
		for i, p := range parts[1:] {
			dir = filepath.Join(dir, p)
			mkdir(dir)
			write(filepath.Join(dir, "numa_node"), numa+"\n")
			link("../../../devices/"+strings.Join(parts[:i+2], "/"), filepath.Join(sys, "bus", "pci", "devices", p))
		}
		return dir
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		w := strings.Fields(line)
		switch {
		case w[0] == "nodes" && len(w) == 2:
			n, err := strconv.Atoi(w[1])
			if err != nil || n < 1 {
				t.Fatalf("%s: bad line %q", name, line)
			}
			online := "0"
			if n > 1 {
				online = fmt.Sprintf("0-%d", n-1)
			}
			mkdir(filepath.Join(sys, "devices", "system", "node"))
			write(filepath.Join(sys, "devices", "system", "node", "online"), online+"\n")
		case w[0] == "gpu" && len(w) == 3:
			device(w[1], w[2])
		case w[0] == "nic" && len(w) == 4:
			dir := device(w[2], w[3])
			ib := filepath.Join(dir, "infiniband", w[1])
			mkdir(ib)
			rel, err := filepath.Rel(filepath.Join(sys, "class", "infiniband"), ib)
			if err != nil {
				t.Fatal(err)
			}
			link(rel, filepath.Join(sys, "class", "infiniband", w[1]))
			link("../../../"+filepath.Base(dir), filepath.Join(ib, "device"))
		case w[0] == "soft" && len(w) == 2:
			ib := filepath.Join(sys, "devices", "virtual", "infiniband", w[1])
			mkdir(ib)
			link("../../devices/virtual/infiniband/"+w[1], filepath.Join(sys, "class", "infiniband", w[1]))
		case w[0] == "want" && len(w) >= 4:
			if fx.want[w[1]] == nil {
				fx.want[w[1]] = map[string]string{}
				fx.gpus = append(fx.gpus, w[1])
			}
			for _, n := range w[3:] {
				fx.want[w[1]][n] = w[2]
			}
		case w[0] == "warn" && len(w) == 2:
			fx.warns[w[1]] = true
		default:
			t.Fatalf("%s: bad line %q", name, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return fx
}
