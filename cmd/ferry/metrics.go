package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/metrics"
)

// metricsFlags are the flags of the commands that run a node and can serve
// its metrics.
type metricsFlags struct {
	addr  *string
	pprof *bool
}

func addMetricsFlags(fs *flag.FlagSet) metricsFlags {
	return metricsFlags{
		addr:  fs.String("metrics-address", "", "serve the node's Prometheus metrics at this host:port (/metrics)"),
		pprof: fs.Bool("pprof", false, "also serve /debug/pprof on the metrics listener"),
	}
}

// serve starts the metrics listener of node when an address is set, and
// says where it listens on w; the returned function stops it.
func (f metricsFlags) serve(node *actor.Node, w io.Writer) (stop func(), err error) {
	if *f.addr == "" {
		if *f.pprof {
			return nil, &exitError{code: 2, err: fmt.Errorf("--pprof needs --metrics-address")}
		}
		return func() {}, nil
	}
	srv, err := metrics.Serve(context.Background(), *f.addr, metrics.Options{Pprof: *f.pprof}, node)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "metrics of %s: http://%s/metrics\n", node.Name(), srv.Addr())
	return func() { _ = srv.Close() }, nil
}
