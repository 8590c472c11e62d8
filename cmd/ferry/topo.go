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
	_ "github.com/tensorferry/tensorferry/rdma/builtin" // the channels a node runs
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
	p := probeLocal()
	if err := printTopo(stdout, cfg, p); err != nil {
		return err
	}
	return printVerbsGrants(stdout, cfg, p)
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
func predictCaps(cfg *cluster.Config, nc cluster.NodeConfig, p localProbe) rdma.Caps {
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
