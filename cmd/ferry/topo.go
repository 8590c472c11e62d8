package main

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	_ "github.com/tensorferry/tensorferry/rdma/builtin" // the channels a node runs
	"github.com/tensorferry/tensorferry/rdma/verbs"
	"github.com/tensorferry/tensorferry/shm"
)

func runTopo(args []string, stdout io.Writer) error {
	fs := newFlags("topo")
	configPath := fs.String("config", "", "cluster config file (YAML)")
	sysfs := fs.String("sysfs", "/", "root of the sysfs tree to read the PCI topology from (a captured tree: every RDMA device in it counts as usable)")
	gpus := fs.String("gpus", "", "comma-separated PCI bus ids of the GPUs to place (default: this host's, from NVML)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config"); err != nil {
		return err
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	p := probeLocal()
	if err := printTopo(stdout, cfg, p); err != nil {
		return err
	}
	if err := printControl(stdout, cfg, probeLocal(), shm.Config{Disable: !cfg.Transport.SharedMemory}); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := printHostNICs(stdout, *sysfs, *gpus); err != nil {
		return err
	}
	return printVerbsGrants(stdout, cfg, p)
}

// printHostNICs prints, for each GPU of this host (or of --gpus), the RDMA
// device the verbs channel takes for it and its distance class.
func printHostNICs(w io.Writer, sysfs, gpuList string) error {
	var gpus []gpuRow
	if gpuList != "" {
		for i, b := range strings.Split(gpuList, ",") {
			gpus = append(gpus, gpuRow{index: i, bus: strings.TrimSpace(b)})
		}
	} else {
		ht, err := memory.Topology()
		if err != nil {
			fmt.Fprintf(w, "NICs: no GPU visible on this host (%v)\n", err)
			return nil
		}
		for _, g := range ht.GPUs {
			gpus = append(gpus, gpuRow{index: g.Index, bus: g.PCIBusID})
		}
	}
	var bus []string
	for _, g := range gpus {
		bus = append(bus, g.bus)
	}
	t, err := pcitopo.Rank(sysfs, bus)
	if err != nil {
		return err
	}
	usable := func(string) bool { return true }
	if filepath.Clean(sysfs) == "/" {
		live := map[string]bool{}
		for _, d := range verbs.LocalDevices() {
			live[d.Name] = true
		}
		usable = func(n string) bool { return live[n] }
	}
	return printNICs(w, gpus, t, usable)
}

// gpuRow names one GPU of the NIC table.
type gpuRow struct {
	index int
	bus   string
}

// printNICs prints the NIC table from a ranking (pcitopo.Rank of the GPUs'
// bus ids, in the same order): for each GPU the NIC chosen (the nearest
// with a usable port, as the verbs channel picks), its class and the
// nearest NICs; then a warning for every GPU whose only paths cross
// sockets, or whose chosen NIC does because nearer ones are unusable.
func printNICs(w io.Writer, gpus []gpuRow, t pcitopo.Topology, usable func(string) bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tBUS ID\tNUMA\tNIC\tCLASS\tNEAREST")
	var warns []string
	for i, g := range t.GPUs {
		numa := "?"
		if g.Err == nil && g.Loc.NUMANode >= 0 {
			numa = fmt.Sprint(g.Loc.NUMANode)
		}
		nic, class := "none", "-"
		if p, ok := g.Choose(usable); ok {
			nic, class = p.NIC, p.Class.String()
		}
		var near []string
		for _, p := range g.Nearest() {
			near = append(near, p.NIC)
		}
		nearest := strings.Join(near, ",")
		if nearest == "" {
			nearest = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", gpus[i].index, g.BusID, numa, nic, class, nearest)
		name := fmt.Sprintf("GPU %d (%s)", gpus[i].index, g.BusID)
		switch {
		case g.Err != nil:
			warns = append(warns, fmt.Sprintf("warning: %s: distance to the NICs unknown: %v", name, g.Err))
		case g.CrossSocketOnly():
			warns = append(warns, fmt.Sprintf("warning: %s: every path to a NIC crosses sockets (SYS): GPUDirect RDMA will be slow or refused", name))
		case len(g.NICs) > 0 && g.NICs[0].Class == pcitopo.ClassUnknown:
			warns = append(warns, fmt.Sprintf("note: %s: distance to every NIC unknown (no PCI path or NUMA node in sysfs): the first usable NIC is taken", name))
		case class == pcitopo.ClassSys.String():
			warns = append(warns, fmt.Sprintf("warning: %s: no NIC of its nearest class has a usable port; %s crosses sockets (SYS)", name, nic))
		}
	}
	if len(t.GPUs) == 0 {
		fmt.Fprintln(tw, "-\t-\t-\t-\t-\t-")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range t.NICs {
		if n.Err != nil {
			fmt.Fprintf(w, "note: %s: %v\n", n.Name, n.Err)
		}
	}
	for _, s := range warns {
		fmt.Fprintln(w, s)
	}
	return nil
}

// localProbe is what this machine can tell about nodes that run on it.
type localProbe struct {
	addrs map[string]bool // IP addresses of this host
}

func probeLocal() localProbe {
	p := localProbe{addrs: map[string]bool{}}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if ipn, ok := a.(*net.IPNet); ok {
				p.addrs[ipn.IP.String()] = true
			}
		}
	}
	return p
}

// isLocal reports whether a host:port names this machine.
func (p localProbe) isLocal(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || p.addrs[ip.String()])
}

// predictCaps builds the capabilities a node of the config would advertise:
// measured (rdma.LocalCaps, as the node itself does) for nodes on this
// machine; from the config alone for the others, where a channel whose
// viability depends on hardware is assumed absent.
func predictCaps(cfg *config.Config, nc config.NodeConfig, p localProbe) rdma.Caps {
	disabled := func(ch string) bool { return cfg.ChannelDisabled(nc.Name, ch) }
	if p.isLocal(nc.Address) {
		return rdma.LocalCaps(nc.Name, 0, nc.Devices, disabled, nil)
	}
	host, _, _ := net.SplitHostPort(nc.Address)
	c := rdma.Caps{Node: nc.Name, HostID: "host " + host, NotRunning: map[string]string{}}
	for _, d := range nc.Devices {
		if d.Kind == memory.KindCUDA {
			c.Devices = append(c.Devices, rdma.DeviceInfo{Device: d.String()})
		}
	}
	for _, b := range rdma.Backends() {
		switch {
		case disabled(b.Name):
			c.NotRunning[b.Name] = "disabled in the config"
		case b.Hardware:
			c.NotRunning[b.Name] = "unknown from here (not this host): assumed absent"
		default:
			c.Channels = append(c.Channels, b.Name)
		}
	}
	return c
}

// printTopo prints, for every ordered pair of nodes (owner → fetcher) and
// every pair of their devices, the channel Select picks and why each other
// channel was rejected.
func printTopo(w io.Writer, cfg *config.Config, p localProbe) error {
	caps := map[string]rdma.Caps{}
	for _, nc := range cfg.Nodes {
		caps[nc.Name] = predictCaps(cfg, nc, p)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OWNER\tFETCHER\tCHANNEL\tREJECTED")
	for _, a := range cfg.Nodes {
		for _, b := range cfg.Nodes {
			if a.Name == b.Name && !slices.ContainsFunc(a.Devices, func(d memory.Device) bool { return d.Kind == memory.KindCUDA }) {
				continue
			}
			oc, fc := caps[a.Name], caps[b.Name]
			if a.Name == b.Name {
				fc.Incarnation, oc.Incarnation = 1, 1
			} else {
				oc.Incarnation, fc.Incarnation = 1, 2
			}
			for _, sd := range devicesOrCPU(a.Devices) {
				for _, dd := range devicesOrCPU(b.Devices) {
					ch := rdma.Select(&oc, &fc, sd, dd)
					var why []string
					for _, r := range ch.Rejected {
						why = append(why, r.Channel+": "+r.Reason)
					}
					chosen := ch.Channel
					if chosen == "" {
						chosen = "NONE"
					}
					fmt.Fprintf(tw, "%s/%s\t%s/%s\t%s\t%s\n", a.Name, sd, b.Name, dd, chosen, strings.Join(why, "; "))
				}
			}
		}
	}
	return tw.Flush()
}

func devicesOrCPU(ds []memory.Device) []memory.Device {
	if len(ds) == 0 {
		return []memory.Device{memory.CPU}
	}
	return ds
}
