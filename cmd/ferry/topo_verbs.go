package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

// printVerbsGrants prints, for every node of the config, how its verbs
// channel grants exports to peers (memory windows, or per-export
// registration) and why: measured (verbs.GrantsOf, which probes the RDMA
// device once) for nodes on this machine; unknown for the others.
func printVerbsGrants(w io.Writer, cfg *config.Config, p localProbe) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nNODE\tVERBS GRANTS\tWHY")
	var (
		probed bool
		mode   verbs.GrantMode
		why    string
		err    error
	)
	for _, nc := range cfg.Nodes {
		switch {
		case cfg.ChannelDisabled(nc.Name, rdma.Verbs):
			fmt.Fprintf(tw, "%s\t-\tverbs disabled in the config\n", nc.Name)
		case !p.isLocal(nc.Address):
			fmt.Fprintf(tw, "%s\t?\tunknown from here (not this host)\n", nc.Name)
		default:
			if !probed {
				mode, why, err = verbs.GrantsOf(verbs.Config{VerbsConfig: cfg.Verbs})
				probed = true
			}
			if err != nil {
				fmt.Fprintf(tw, "%s\t-\t%v\n", nc.Name, err)
			} else {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", nc.Name, mode, why)
			}
		}
	}
	return tw.Flush()
}
