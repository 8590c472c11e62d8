package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, &exitError{code: 2, err: fmt.Errorf("--log-level: %w", err)}
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Encoding = "console"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

// startNode loads the config and starts the named node.
func startNode(configPath, name string, log *zap.Logger, opts ...actor.Option) (*actor.Node, *config.Config, error) {
	cfg, err := config.Load(configPath)
	if err != nil {
		return nil, nil, err
	}
	return startLoaded(cfg, name, log, opts...)
}

// startLoaded starts the named node of cfg.
func startLoaded(cfg *config.Config, name string, log *zap.Logger, opts ...actor.Option) (*actor.Node, *config.Config, error) {
	node, err := actor.NewNode(cfg, name, append([]actor.Option{actor.WithLogger(log)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	if err := node.Start(); err != nil {
		return nil, nil, err
	}
	return node, cfg, nil
}

func runNode(args []string, stdout io.Writer) error {
	fs := newFlags("node")
	configPath := fs.String("config", "", "cluster config file (YAML)")
	name := fs.String("name", "", "name of this node in the config")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	mf := addMetricsFlags(fs)
	sf := addSelfFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config", "name"); err != nil {
		return err
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	if err := sf.apply(cfg, *name); err != nil {
		return err
	}
	log, err := newLogger(*level)
	if err != nil {
		return err
	}
	defer log.Sync()
	traced, flush, err := startTracing()
	if err != nil {
		return err
	}
	defer flush()
	node, cfg, err := startLoaded(cfg, *name, log, traced...)
	if err != nil {
		return err
	}
	stopMetrics, err := mf.serve(node, cfg, stdout)
	if err != nil {
		_ = node.Stop()
		return err
	}
	defer stopMetrics()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.Info("shutting down", zap.Stringer("signal", s))
	signal.Stop(sig)
	return node.Stop()
}

// selfFlags describe the node itself when the config's nodes do not list
// it: with a discovery section, a node may come from the command line and
// register itself.
type selfFlags struct {
	address, dataAddress, devices *string
}

func addSelfFlags(fs *flag.FlagSet) selfFlags {
	return selfFlags{
		address:     fs.String("address", "", "host:port of this node's control listener, when --name is not in the config (needs a discovery section)"),
		dataAddress: fs.String("data-address", "", "host:port of this node's data listener (default: --address's port + 100)"),
		devices:     fs.String("devices", "", "comma-separated devices this node offers, such as cpu,cuda:0 (default cpu)"),
	}
}

// apply adds node name to cfg from the flags when cfg does not list it.
func (sf selfFlags) apply(cfg *config.Config, name string) error {
	set := *sf.address != "" || *sf.dataAddress != "" || *sf.devices != ""
	if _, ok := cfg.Node(name); ok {
		if set {
			return &exitError{code: 2, err: fmt.Errorf("node %q is in the config: --address, --data-address and --devices are for a node that is not", name)}
		}
		return nil
	}
	if cfg.Discovery == nil {
		return fmt.Errorf("node %q is not in the config, which has no discovery section to register it in", name)
	}
	if *sf.address == "" {
		return &exitError{code: 2, err: fmt.Errorf("node %q is not in the config: --address is required", name)}
	}
	n := config.NodeConfig{Name: name, Address: *sf.address, DataAddress: *sf.dataAddress}
	if *sf.devices != "" {
		for _, s := range strings.Split(*sf.devices, ",") {
			d, err := memory.ParseDevice(strings.TrimSpace(s))
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("--devices: %w", err)}
			}
			n.Devices = append(n.Devices, d)
		}
	}
	cfg.Nodes = append(cfg.Nodes, n)
	return cfg.Validate()
}
