package pcitopo

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Class is how far apart two PCI devices are, the classes of
// `nvidia-smi topo -m` (NVML's nvmlGpuTopologyLevel_t), nearest first.
// The zero value is ClassUnknown, which ranks after every known class.
type Class uint8

const (
	// ClassUnknown: the path between the devices could not be read (no
	// PCI device behind the NIC, as for soft-RoCE; a sysfs entry missing or
	// malformed; NUMA nodes unknown on a host with several).
	ClassUnknown Class = iota
	// ClassPIX: at most one PCIe switch between them (GPUDirect RDMA's best
	// case: peer traffic never leaves the switch).
	ClassPIX
	// ClassPXB: several PCIe switches, but no host bridge.
	ClassPXB
	// ClassPHB: through a PCIe host bridge, the CPU's root complex.
	ClassPHB
	// ClassNode: between PCIe host bridges of one NUMA node.
	ClassNode
	// ClassSys: across NUMA nodes, over the SMP interconnect (QPI/UPI,
	// Infinity Fabric): the worst path, where peer-to-peer DMA is slow or
	// not supported at all.
	ClassSys
)

var classNames = [...]string{ClassUnknown: "unknown", ClassPIX: "PIX", ClassPXB: "PXB", ClassPHB: "PHB", ClassNode: "NODE", ClassSys: "SYS"}

// String returns the nvidia-smi name: "PIX", "PXB", "PHB", "NODE", "SYS",
// or "unknown".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// rank orders classes nearest first, ClassUnknown (and anything invalid)
// last.
func (c Class) rank() int {
	if c == ClassUnknown || int(c) >= len(classNames) {
		return len(classNames)
	}
	return int(c)
}

// Better reports whether c is a nearer class than o.
func (c Class) Better(o Class) bool { return c.rank() < o.rank() }

// Location is where a PCI device sits in the PCI tree.
type Location struct {
	// Bus is the device's address.
	Bus BusID
	// HostBridge is the root complex it hangs from, as sysfs names it
	// ("pci0000:00").
	HostBridge string
	// Path is the chain of PCI devices from the host bridge down: the root
	// port first (absent when the device sits on the root bus itself), then
	// for every PCIe switch its upstream and downstream port, the device
	// last.
	Path []BusID
	// NUMANode is the node of the device's slot; -1 when unknown.
	NUMANode int
}

// Distance returns the class of the path between two located devices.
// oneNode says the host has a single NUMA node, so that devices of unknown
// node are on the same one.
//
// Below one host bridge the class follows from the switches crossed: the
// paths are compared from the root port down; a path's elements after the
// root port alternate between a switch's upstream and downstream port, so
// the switches crossed are the one whose ports the paths share last, plus
// the upstream ports on each side below it. At most one switch is PIX,
// more PXB; paths that part at the root complex are PHB. Different host
// bridges are NODE on one NUMA node and SYS across nodes.
func Distance(a, b Location, oneNode bool) Class {
	if a.HostBridge == "" || b.HostBridge == "" || len(a.Path) == 0 || len(b.Path) == 0 {
		return ClassUnknown
	}
	if a.HostBridge != b.HostBridge {
		switch {
		case a.NUMANode >= 0 && b.NUMANode >= 0 && a.NUMANode == b.NUMANode:
			return ClassNode
		case a.NUMANode >= 0 && b.NUMANode >= 0:
			return ClassSys
		case oneNode:
			return ClassNode
		}
		return ClassUnknown
	}
	c := 0
	for c < len(a.Path) && c < len(b.Path) && a.Path[c] == b.Path[c] {
		c++
	}
	if c == 0 {
		return ClassPHB
	}
	switches := 0
	if c >= 2 { // the last shared element is a port of a switch
		switches = 1
	}
	for _, p := range [][]BusID{a.Path, b.Path} {
		for i := c; i < len(p)-1; i++ {
			if i%2 == 1 { // an upstream port: one more switch
				switches++
			}
		}
	}
	if switches <= 1 {
		return ClassPIX
	}
	return ClassPXB
}

// sysDir returns root/sys/<elem...>; root "" means "/".
func sysDir(root string, elem ...string) string {
	if root == "" {
		root = "/"
	}
	return filepath.Join(append([]string{root, "sys"}, elem...)...)
}

// Locate reads where the PCI device bus sits, from the sysfs under root
// (the directory holding sys/; "" or "/" for this machine):
// root/sys/bus/pci/devices/<bus> and the directory it links to.
func Locate(root string, bus BusID) (Location, error) {
	l, err := locate(root, sysDir(root, "bus", "pci", "devices", bus.String()))
	if err != nil {
		return Location{}, fmt.Errorf("pcitopo: PCI device %s: %w", bus, err)
	}
	return l, nil
}

// locate resolves link (a sysfs link to a device's directory) and reads the
// PCI location of the deepest PCI device on the resolved path.
func locate(root, link string) (Location, error) {
	devices, err := filepath.EvalSymlinks(sysDir(root, "devices"))
	if err != nil {
		return Location{}, err
	}
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Location{}, err
	}
	rel, err := filepath.Rel(devices, real)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return Location{}, fmt.Errorf("%s is not under %s", real, devices)
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if !isHostBridge(parts[0]) {
		return Location{}, fmt.Errorf("%s is not on a PCI bus", real)
	}
	l := Location{HostBridge: parts[0], NUMANode: -1}
	dir := filepath.Join(devices, parts[0])
	pciDir := ""
	for _, p := range parts[1:] {
		dir = filepath.Join(dir, p)
		if isHostBridge(p) { // a bridge into another domain (Intel VMD)
			continue
		}
		id, err := ParseBusID(p)
		if err != nil || p != id.String() {
			break // a class directory or child device below the PCI device
		}
		l.Path = append(l.Path, id)
		pciDir = dir
	}
	if len(l.Path) == 0 {
		return Location{}, fmt.Errorf("%s: no PCI device below host bridge %s", real, parts[0])
	}
	l.Bus = l.Path[len(l.Path)-1]
	l.NUMANode = readNUMANode(filepath.Join(pciDir, "numa_node"))
	return l, nil
}

// isHostBridge reports whether a sysfs name is a PCI root: "pci0000:00".
func isHostBridge(s string) bool {
	dom, bus, ok := strings.Cut(strings.TrimPrefix(s, "pci"), ":")
	if !ok || !strings.HasPrefix(s, "pci") {
		return false
	}
	_, err1 := hexField(dom, 8, 32)
	_, err2 := hexField(bus, 2, 8)
	return err1 == nil && err2 == nil
}

// readNUMANode reads a numa_node file; -1 when absent, malformed or -1.
func readNUMANode(path string) int {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 32 {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// NUMANode returns the NUMA node of the PCI device bus (a bus id in any
// form ParseBusID reads) from the sysfs under root, -1 when the kernel does
// not know it; an error when the id is malformed or the device is absent.
func NUMANode(root, bus string) (int, error) {
	id, err := ParseBusID(bus)
	if err != nil {
		return -1, err
	}
	l, err := Locate(root, id)
	if err != nil {
		return -1, err
	}
	return l.NUMANode, nil
}

// OneNUMANode reports whether the host under root has a single NUMA node:
// sys/devices/system/node/online lists one node, or the kernel has no NUMA
// support (no node directory at all).
func OneNUMANode(root string) bool {
	b, err := os.ReadFile(sysDir(root, "devices", "system", "node", "online"))
	if err != nil {
		_, serr := os.Stat(sysDir(root, "devices", "system", "node"))
		return errors.Is(err, fs.ErrNotExist) && errors.Is(serr, fs.ErrNotExist)
	}
	s := strings.TrimSpace(string(b))
	_, err = strconv.Atoi(s) // a single number, not a list or range
	return err == nil
}

// NIC is an RDMA device of the host.
type NIC struct {
	// Name is the device's name, as libibverbs and
	// /sys/class/infiniband list it ("mlx5_0").
	Name string
	// Loc is where it sits; valid when Err is nil.
	Loc Location
	// Err says why its location is unknown (a software device such as
	// soft-RoCE, which has no PCI function; a broken sysfs entry).
	Err error
}

// NICs lists the RDMA devices under root/sys/class/infiniband, sorted by
// name, each located through its device link. No such directory means no
// RDMA device (nil, nil); another error reading it is returned.
func NICs(root string) ([]NIC, error) {
	dir := sysDir(root, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pcitopo: RDMA devices: %w", err)
	}
	var out []NIC
	for _, e := range ents {
		n := NIC{Name: e.Name()}
		l, err := locate(root, filepath.Join(dir, e.Name(), "device"))
		if err != nil {
			n.Err = fmt.Errorf("pcitopo: RDMA device %s: %w", e.Name(), err)
		} else {
			n.Loc = l
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b NIC) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Path is one NIC as seen from one GPU.
type Path struct {
	NIC   string
	Class Class
}

// GPU is one GPU's view of the NICs.
type GPU struct {
	// BusID is the GPU's bus id as given to Rank.
	BusID string
	// Loc is where it sits; valid when Err is nil.
	Loc Location
	// Err says why it could not be located (malformed bus id, no such
	// device): every NIC is then ClassUnknown from it.
	Err error
	// NICs are every NIC of the host, nearest class first, by name within a
	// class.
	NICs []Path
}

// Nearest returns the NICs of the nearest class (ClassUnknown ones only
// when no class is known): the candidates a channel serving this GPU
// should use.
func (g GPU) Nearest() []Path {
	if len(g.NICs) == 0 {
		return nil
	}
	best := g.NICs[0].Class
	i := 0
	for i < len(g.NICs) && g.NICs[i].Class == best {
		i++
	}
	return g.NICs[:i:i]
}

// CrossSocketOnly reports whether every path from the GPU to a NIC crosses
// NUMA nodes (the nearest class is SYS): GPUDirect RDMA through it will be
// slow or refused.
func (g GPU) CrossSocketOnly() bool {
	return len(g.NICs) > 0 && g.NICs[0].Class == ClassSys
}

// Topology is the GPUs and NICs of a host with the class of every path.
type Topology struct {
	// OneNode is OneNUMANode of the root.
	OneNode bool
	NICs    []NIC
	GPUs    []GPU // in the order of the bus ids given
}

// Rank reads the PCI tree from the sysfs under root ("" or "/" for this
// machine) and ranks the NICs of each GPU (bus ids from NVML, CUDA or
// lspci) by distance class. A GPU or NIC that cannot be located gets
// ClassUnknown paths and its reason in Err; the error is for a NIC list
// that cannot be read at all.
func Rank(root string, gpuBusIDs []string) (Topology, error) {
	nics, err := NICs(root)
	if err != nil {
		return Topology{}, err
	}
	t := Topology{OneNode: OneNUMANode(root), NICs: nics}
	for _, s := range gpuBusIDs {
		g := GPU{BusID: s}
		if id, err := ParseBusID(s); err != nil {
			g.Err = err
		} else if g.Loc, err = Locate(root, id); err != nil {
			g.Err = err
		}
		for _, n := range nics {
			c := ClassUnknown
			if g.Err == nil && n.Err == nil {
				c = Distance(g.Loc, n.Loc, t.OneNode)
			}
			g.NICs = append(g.NICs, Path{NIC: n.Name, Class: c})
		}
		slices.SortStableFunc(g.NICs, func(a, b Path) int { return a.Class.rank() - b.Class.rank() })
		t.GPUs = append(t.GPUs, g)
	}
	return t, nil
}

// Choose returns the nearest NIC for which usable is true (the first such
// in NICs, so the order of names within a class), and whether there is one.
func (g GPU) Choose(usable func(nic string) bool) (Path, bool) {
	for _, p := range g.NICs {
		if usable(p.NIC) {
			return p, true
		}
	}
	return Path{}, false
}
