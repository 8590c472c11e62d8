package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tensorferry/tensorferry/actor"
	"golang.org/x/net/netutil"
)

// Server is a node's metrics listener: /metrics in Prometheus' text
// format, and /debug/pprof when Options.Pprof is set.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
	err  error

	closeOnce sync.Once
	stop      func() bool
}

// Registry returns a registry holding the collectors of nodes (each
// series labelled with its node's name) and the Go runtime's and process'
// collectors. It fails if two nodes have the same name.
func Registry(opts Options, nodes ...*actor.Node) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Name()] {
			return nil, fmt.Errorf("metrics: node %s given twice", n.Name())
		}
		seen[n.Name()] = true
	}
	// The nodes' descriptions are the same (the node is a label): they
	// are registered once, as one collector of every node.
	if len(nodes) > 0 {
		if err := reg.Register(&multi{cs: collectorsOf(opts, nodes)}); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

func collectorsOf(opts Options, nodes []*actor.Node) []*Collector {
	cs := make([]*Collector, len(nodes))
	for i, n := range nodes {
		cs[i] = NewCollector(n, opts)
	}
	return cs
}

// multi collects several nodes' collectors under one set of descriptions.
type multi struct{ cs []*Collector }

func (m *multi) Describe(ch chan<- *prometheus.Desc) { m.cs[0].Describe(ch) }

func (m *multi) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.cs {
		c.Collect(ch)
	}
}

// Handler returns the HTTP handler of a metrics listener for the
// registry: /metrics, and /debug/pprof/ when pprof is set.
func Handler(reg *prometheus.Registry, pprofOn bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Serve listens on addr (host:port; port 0 picks a free one, see Addr)
// and serves the metrics of nodes (usually the one node of the process;
// an embedded cluster's several) until ctx is done or Close is called.
// Start the nodes first.
func Serve(ctx context.Context, addr string, opts Options, nodes ...*actor.Node) (*Server, error) {
	reg, err := Registry(opts, nodes...)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen: %w", err)
	}
	maxConns, idle := opts.MaxConns, opts.IdleTimeout
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	ln = netutil.LimitListener(ln, maxConns)
	s := &Server{
		ln: ln,
		srv: &http.Server{Handler: Handler(reg, opts.Pprof),
			ReadHeaderTimeout: DefaultReadTimeout, ReadTimeout: DefaultReadTimeout,
			WriteTimeout: DefaultWriteTimeout, IdleTimeout: idle},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	s.stop = context.AfterFunc(ctx, func() { _ = s.Close() })
	return s, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server: the listener and every connection are closed.
// It returns the error that ended serving, if any other than Close.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.stop()
		_ = s.srv.Close()
	})
	<-s.done
	return s.err
}
