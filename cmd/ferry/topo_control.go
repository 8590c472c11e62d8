package main

import (
	"fmt"
	"io"
	"net"
	"strings"
	"text/tabwriter"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
)

// printControl prints, for every pair of nodes, what their control
// connection would run over (a live node reports it: Peer.Transport) and
// why: shared memory between nodes of this host when this host can make
// the rings, and between nodes whose addresses name one other host; TCP
// (or TLS) otherwise.
func printControl(w io.Writer, cfg *config.Config, p localProbe, sc shm.Config) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch mode := cfg.MembershipMode(); mode {
	case config.MembershipGossip:
		fmt.Fprintf(tw, "\nMEMBERSHIP\tgossip: liveness by SWIM gossip; control connections dialed on first use, closed after %v idle\n", cfg.Transport.IdleTimeout)
		var meshOnly []string
		for _, n := range cfg.Nodes {
			if n.MeshOnly {
				meshOnly = append(meshOnly, n.Name)
			}
		}
		if len(meshOnly) > 0 {
			fmt.Fprintf(tw, "MESH ONLY\t%s: not in gossip (PyTorch nodes, say); every node holds a control connection to each, redialed, heartbeats every %v, down after %v silent, never closed as idle\n",
				strings.Join(meshOnly, ", "), cfg.HeartbeatInterval, cfg.FailureTimeout)
		}
	default:
		fmt.Fprintf(tw, "\nMEMBERSHIP\t%s: a control connection to every node, heartbeats every %v\n", mode, cfg.HeartbeatInterval)
	}
	if cfg.Discovery != nil && cfg.Discovery.Etcd != nil {
		fmt.Fprintf(tw, "DISCOVERY\tetcd %v, prefix %s\n", cfg.Discovery.Etcd.Endpoints, cfg.Discovery.Etcd.Prefix)
	}
	fmt.Fprintln(tw, "\nNODE\tPEER\tCONTROL\tWHY")
	socket := "tcp"
	if cfg.TLS != nil {
		socket = "tls"
	}
	for i, a := range cfg.Nodes {
		for _, b := range cfg.Nodes[i+1:] {
			transport, why := socket, ""
			ha, _, _ := net.SplitHostPort(a.Address)
			hb, _, _ := net.SplitHostPort(b.Address)
			switch {
			case sc.Disable:
				why = "shared memory disabled"
			case p.isLocal(a.Address) && p.isLocal(b.Address):
				if err := sc.Usable(); err != nil {
					why = err.Error()
				} else {
					transport, why = shm.TransportShm, "both on this host"
				}
			case ha == hb && ha != "":
				transport, why = shm.TransportShm, "one host address (not this host: assumed able to share memory)"
			default:
				why = "on different hosts"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Name, b.Name, transport, why)
		}
	}
	return tw.Flush()
}
