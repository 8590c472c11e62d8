package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := need(fs, "config", "name"); err != nil {
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
	node, cfg, err := startNode(*configPath, *name, log, traced...)
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
