package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
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
		addr:  fs.String("metrics-address", "", "serve the node's Prometheus metrics at this host:port (/metrics); default: the node's metrics_address in the config"),
		pprof: fs.Bool("pprof", false, "also serve /debug/pprof on the metrics listener"),
	}
}

// serve starts the metrics listener of node when an address is set (the
// flag, else the node's metrics_address in cfg), and says where it listens
// on w; the returned function stops it. pprof is served when the flag or
// the node's config asks for it.
func (f metricsFlags) serve(node *actor.Node, cfg *config.Config, w io.Writer) (stop func(), err error) {
	addr, pprof := *f.addr, *f.pprof
	if nc, ok := cfg.Node(node.Name()); ok {
		if addr == "" {
			addr = nc.MetricsAddress
		}
		pprof = pprof || nc.Pprof
	}
	if addr == "" {
		if pprof {
			return nil, &exitError{code: 2, err: fmt.Errorf("--pprof needs --metrics-address")}
		}
		return func() {}, nil
	}
	srv, err := metrics.Serve(context.Background(), addr, metrics.Options{Pprof: pprof}, node)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "metrics of %s: http://%s/metrics\n", node.Name(), srv.Addr())
	return func() { _ = srv.Close() }, nil
}
