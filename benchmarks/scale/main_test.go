package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tensorferry/tensorferry/config"
)

// TestRun measures both designs on a tiny cluster with fast timings and
// checks that every figure is there and that both stopped nodes were
// detected by every other node.
func TestRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, err := config.LocalConfig("scale", 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HeartbeatInterval, cfg.FailureTimeout = 50*time.Millisecond, 500*time.Millisecond
	// Push-pull every 2s (default 30s): news of a join that gossip misses
	// on a loaded machine is repaired well within the convergence bound,
	// not at its very end.
	cfg.Gossip = config.GossipConfig{PushPullInterval: 2 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	limit, err := raiseFDLimit()
	if err != nil {
		t.Fatal(err)
	}
	o := options{sizes: []int{5}, modes: []string{modeMesh, modeGossip, modeGossipOnly}, idle: 300 * time.Millisecond,
		settle: 50 * time.Millisecond, converge: 30 * time.Second, joinRate: 1000, cfg: cfg}
	rows, err := run(o, limit, func(r row) { t.Logf("%+v", r) })
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.Skipped != "" || r.N != 5 || r.FDsPerNode <= 0 || r.GoroutinesPerNode <= 0 || r.MsgsPerNodeS <= 0 ||
			r.BytesPerNodeS <= 0 || r.FreezeMissed != 0 || r.KillMissed != 0 || r.FreezeMaxS <= 0 || r.KillMaxS <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	if rows[0].Mode != modeMesh || rows[1].Mode != modeGossip || rows[2].Mode != modeGossipOnly {
		t.Errorf("modes %s, %s, %s", rows[0].Mode, rows[1].Mode, rows[2].Mode)
	}
	if !meshFits(90, 20000, 10) || meshFits(110, 20000, 10) {
		t.Error("meshFits")
	}
	dir := t.TempDir()
	if err := drawAll(dir, rows, cfg); err != nil {
		t.Fatal(err)
	}
}
