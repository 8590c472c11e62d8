package main

import (
	"os"
	"os/exec"
	"testing"
)

// TestTorchPSConverges runs the sample on CPU: two PyTorch workers, two Go
// shards, weights and gradients above the inline threshold (staging).
func TestTorchPSConverges(t *testing.T) {
	py := os.Getenv("TF_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch, msgpack").CombinedOutput(); err != nil {
		t.Skipf("%s lacks torch or msgpack (scripts/deps.sh installs python3-torch python3-msgpack): %v: %s", py, err, out)
	}
	if err := run(2, 2, 30, 65536, py); err != nil {
		t.Fatal(err)
	}
}
