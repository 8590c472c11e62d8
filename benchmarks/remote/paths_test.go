package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestPaths opens every path, measures a few messages and checks that
// closing it leaves no goroutine behind.
func TestPaths(t *testing.T) {
	for _, p := range append([]path{rawTCPPath(), protoRemotePath()}, extraPaths...) {
		t.Run(p.name, func(t *testing.T) {
			if raceEnabled && p.name == "protoactor-grpc" {
				// Races inside the baseline, not in this program: every
				// remote.(*Remote).Start calls grpclog.SetLoggerV2 while an
				// earlier remote's gRPC server logs, and
				// (*endpointManager).stop races with removeEndpoint.
				t.Skip("protoactor-go v0.0.0-20240822202345 remote races internally under -race; run without -race")
			}
			defer goleak.VerifyNone(t)
			rs, err := run(p, 50, 500, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			want := 4
			if p.rttOnly {
				want = 3
			}
			if len(rs) != want {
				t.Fatalf("%d figures, want %d: %+v", len(rs), want, rs)
			}
			for _, r := range rs {
				if r.Value <= 0 {
					t.Errorf("figure %+v", r)
				}
			}
		})
	}
}
