package main

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

func runTopo(args []string, stdout io.Writer) error {
	fs := newFlags("topo")
	config := fs.String("config", "", "cluster config file (YAML)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config"); err != nil {
		return err
	}
	cfg, err := cluster.Load(*config)
	if err != nil {
		return err
	}
	return printTopo(stdout, cfg, probeLocal())
}

// localProbe is what this machine can tell about nodes that run on it.
type localProbe struct {
	hostID   string
	addrs    map[string]bool // IP addresses of this host
	cudaErr  error           // why CUDA cannot be used, nil if it can
	p2p      [][2]string
	uuids    map[int]string // CUDA ordinal → UUID
	verbsErr error
	rdma     []rdma.RDMADevice
}

func probeLocal() localProbe {
	p := localProbe{hostID: memory.HostID(), addrs: map[string]bool{}, uuids: map[int]string{}}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if ipn, ok := a.(*net.IPNet); ok {
				p.addrs[ipn.IP.String()] = true
			}
		}
	}
	if n, err := memory.CUDADeviceCount(); err != nil {
		p.cudaErr = err
	} else if n == 0 {
		p.cudaErr = fmt.Errorf("no CUDA device")
	} else {
		for i := range n {
			if u, _, err := memory.CUDADeviceIdentity(memory.CUDA(i)); err == nil {
				p.uuids[i] = u
			}
		}
		if topo, err := memory.Topology(); err == nil {
			for i, row := range topo.P2P {
				for j, l := range row {
					if i != j && l.Read {
						p.p2p = append(p.p2p, [2]string{topo.GPUs[i].UUID, topo.GPUs[j].UUID})
					}
				}
			}
		}
	}
	if p.verbsErr = verbs.Available(); p.verbsErr == nil {
		p.rdma = verbs.Advertise()
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
// measured for nodes on this machine, from the config alone for the others.
func predictCaps(cfg *cluster.Config, nc cluster.NodeConfig, p localProbe) rdma.Caps {
	c := rdma.Caps{Node: nc.Name, NotRunning: map[string]string{}}
	local := p.isLocal(nc.Address)
	if local {
		c.HostID = p.hostID
		c.P2P = p.p2p
		c.RDMA = p.rdma
	} else {
		host, _, _ := net.SplitHostPort(nc.Address)
		c.HostID = "host " + host
	}
	for _, d := range nc.Devices {
		if d.Kind == memory.KindCUDA {
			uuid := ""
			if local {
				uuid = p.uuids[d.Index]
			}
			c.Devices = append(c.Devices, rdma.DeviceInfo{Device: d.String(), UUID: uuid})
		}
	}
	for _, ch := range rdma.Names {
		switch {
		case cfg.ChannelDisabled(nc.Name, ch):
			c.NotRunning[ch] = "disabled in the config"
		case ch == rdma.IPC && local && p.cudaErr != nil:
			c.NotRunning[ch] = p.cudaErr.Error()
		case ch == rdma.Verbs && local && p.verbsErr != nil:
			c.NotRunning[ch] = p.verbsErr.Error()
		case ch == rdma.Verbs && !local:
			c.NotRunning[ch] = "unknown from here (not this host): assumed absent"
		default:
			c.Channels = append(c.Channels, ch)
		}
	}
	return c
}

// printTopo prints, for every ordered pair of nodes (owner → fetcher) and
// every pair of their devices, the channel Select picks and why each other
// channel was rejected.
func printTopo(w io.Writer, cfg *cluster.Config, p localProbe) error {
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
