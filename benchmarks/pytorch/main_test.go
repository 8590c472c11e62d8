package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"go.uber.org/goleak"
)

// TestMain runs the child Go node when the benchmark re-executes this
// binary as one.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := child(); err != nil {
			os.Stderr.WriteString("child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		// protoactor-go's dead-letter log throttle runs a timer goroutine
		// that outlives ActorSystem.Shutdown by up to its interval.
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

// TestRunCPU runs the three paths on the CPU at small sizes: every figure
// is there, positive, with the channel the receivers reported.
func TestRunCPU(t *testing.T) {
	py := os.Getenv("TF_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("%s lacks torch: %v: %s", py, err, out)
	}
	o, err := options("4KiB", "256KiB", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	o.reps, o.python, o.peer, o.timeout = 3, py, "peer.py", time.Minute
	rs, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3*2*len(o.sizes) {
		t.Fatalf("%d figures, want %d", len(rs), 3*2*len(o.sizes))
	}
	for _, r := range rs {
		want := "inline"
		if r.Size > 64<<10 {
			want = "staging"
		}
		if r.Value <= 0 || r.N != 3 || r.Channel != want {
			t.Fatalf("figure %+v: want a positive value of 3 messages via %s", r, want)
		}
	}
	dir := t.TempDir()
	if err := write(rs, true, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pytorch.csv"))
	if err != nil || strings.Count(string(b), "\n") != len(rs)+1 {
		t.Fatalf("pytorch.csv: %v\n%s", err, b)
	}
	var sum bytes.Buffer
	summary(&sum, rs)
	if strings.Count(sum.String(), "× go-go's time  ") != 2*len(o.sizes) {
		t.Fatalf("summary:\n%s", sum.String())
	}
}

func TestSummaryVerdicts(t *testing.T) {
	rs := []report.Result{
		{Path: "go-go", Size: 16 << 20, Metric: report.GBps, Value: 100},
		{Path: "go-python", Size: 16 << 20, Metric: report.GBps, Value: 95},
		{Path: "python-go", Size: 16 << 20, Metric: report.GBps, Value: 80},
		{Path: "go-go", Size: 4096, Metric: report.GBps, Value: 1},
		{Path: "go-go", Size: 4096, Metric: report.LatencyUs, Value: 10},
		{Path: "go-python", Size: 4096, Metric: report.LatencyUs, Value: 14},
		{Path: "python-go", Size: 4096, Metric: report.LatencyUs, Value: 16},
	}
	var b bytes.Buffer
	summary(&b, rs)
	want := []string{"go-python     4KiB   1.40× go-go's time          met",
		"python-go     4KiB   1.60× go-go's time          MISSED",
		"go-python    16MiB   95.0 % of go-go's bandwidth  met",
		"python-go    16MiB   80.0 % of go-go's bandwidth  MISSED"}
	for _, w := range want {
		if !strings.Contains(b.String(), w) {
			t.Fatalf("summary lacks %q:\n%s", w, b.String())
		}
	}
	if _, err := options("1MiB", "4KiB", "cpu"); err == nil {
		t.Fatal("min above max accepted")
	}
	if o, err := options("4KiB", "1GiB", "cpu"); err != nil || len(o.sizes) != 10 || o.device != memory.CPU {
		t.Fatalf("options: %+v, %v", o, err)
	}
}
