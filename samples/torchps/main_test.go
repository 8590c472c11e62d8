package main

import (
	"os"
	"os/exec"
	"testing"
)

// TestTorchPSConverges runs the sample on CPU: two PyTorch workers, two Go
// shards, weights and gradients above the inline threshold (staging).
// TestTorchPSGPU runs it on GPUs (scripts/gpu/python.sh).
func TestTorchPSConverges(t *testing.T) {
	py := os.Getenv("TF_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("%s lacks torch (scripts/deps.sh installs python3-torch): %v: %s", py, err, out)
	}
	if err := run(2, 2, 30, 65536, py, false, ""); err != nil {
		t.Fatal(err)
	}
}

// TestTorchPSGPU runs the sample on GPUs: shards on cuda:0, workers on
// their GPU, every transfer over ipc. It skips without CUDA.
func TestTorchPSGPU(t *testing.T) {
	py := os.Getenv("TF_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'").CombinedOutput(); err != nil {
		t.Skipf("%s: no torch with CUDA: %v: %s", py, err, out)
	}
	cuda, err := useGPU("on")
	if err != nil {
		t.Skip(err)
	}
	if err := run(2, 2, 30, 65536, py, cuda, ""); err != nil {
		t.Fatal(err)
	}
}
