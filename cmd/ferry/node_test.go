package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
)

func TestSelfFlags(t *testing.T) {
	parse := func(args ...string) selfFlags {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		sf := addSelfFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return sf
	}
	withDiscovery := func() *config.Config {
		cfg, err := config.LocalConfig("ferry", 1)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{"http://127.0.0.1:2379"}}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}

	cfg := withDiscovery()
	if err := parse("--address", "127.0.0.1:9000", "--devices", "cpu, cuda:1").apply(cfg, "extra"); err != nil {
		t.Fatal(err)
	}
	n, ok := cfg.Node("extra")
	if !ok || n.Address != "127.0.0.1:9000" || n.DataAddress != "127.0.0.1:9100" || len(n.Devices) != 2 || n.Devices[1] != memory.CUDA(1) {
		t.Fatalf("extra node %+v", n)
	}
	// A node the file lists takes nothing from the flags.
	if err := parse().apply(cfg, "node0"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		name string
		cfg  *config.Config
		want string
	}{
		{[]string{"--address", "127.0.0.1:9000"}, "node0", withDiscovery(), "is in the config"},
		{nil, "extra", withDiscovery(), "--address is required"},
		{[]string{"--address", "127.0.0.1:9000", "--devices", "tpu"}, "extra", withDiscovery(), "--devices"},
		{[]string{"--address", "nohost"}, "extra", withDiscovery(), "address"},
		{[]string{"--address", "127.0.0.1:9000"}, "extra", func() *config.Config { c, _ := config.LocalConfig("ferry", 1); return c }(), "no discovery section"},
	} {
		if err := parse(tc.args...).apply(tc.cfg, tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v for %q: %v, want an error with %q", tc.args, tc.name, err, tc.want)
		}
	}
}
