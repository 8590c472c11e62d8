package memory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestIPCRejectsHostMemory(t *testing.T) {
	h, _ := NewHostBuffer(64)
	if _, _, err := ExportIPC(h); err == nil {
		t.Error("ExportIPC of host memory succeeded")
	}
	if _, _, _, err := DmaBuf(h); err == nil {
		t.Error("DmaBuf of host memory succeeded")
	}
}

// TestGPUIPCTwoProcesses exports a buffer, has a child process open the
// handle and hash the bytes at the exporter's offset, and compares.
func TestGPUIPCTwoProcesses(t *testing.T) {
	needGPU(t)
	ca, _ := AllocatorFor(CUDA(0))
	buf, err := ca.Alloc(6 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	src := randomBytes(6<<20, 99)
	if err := Copy(context.Background(), buf, WrapHost(src)); err != nil {
		t.Fatal(err)
	}
	view, _ := buf.Slice(1<<20, 3<<20)
	h, off, err := ExportIPC(view)
	if err != nil {
		t.Fatal(err)
	}
	if off != 1<<20 || h.Size < 6<<20 {
		t.Fatalf("offset %d, size %d", off, h.Size)
	}
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^TestGPUIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), "TF_IPC_HANDLE="+hex.EncodeToString(h.Handle[:]),
		"TF_IPC_SIZE="+strconv.Itoa(h.Size), "TF_IPC_OFF="+strconv.Itoa(off), "TF_IPC_LEN="+strconv.Itoa(3<<20))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	sum := sha256.Sum256(src[1<<20 : 4<<20])
	if !strings.Contains(string(out), "sum="+hex.EncodeToString(sum[:])) {
		t.Fatalf("child read other bytes:\n%s", out)
	}
}

func TestGPUIPCChild(t *testing.T) {
	hs := os.Getenv("TF_IPC_HANDLE")
	if hs == "" {
		t.Skip("helper for TestGPUIPCTwoProcesses")
	}
	raw, _ := hex.DecodeString(hs)
	var h IPCHandle
	copy(h.Handle[:], raw)
	h.Size, _ = strconv.Atoi(os.Getenv("TF_IPC_SIZE"))
	off, _ := strconv.Atoi(os.Getenv("TF_IPC_OFF"))
	n, _ := strconv.Atoi(os.Getenv("TF_IPC_LEN"))
	m, err := OpenIPC(CUDA(0), h)
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.Slice(off, n)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := Copy(context.Background(), WrapHost(got), v); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(got)
	t.Logf("sum=%s", hex.EncodeToString(sum[:]))
}

func TestGPUDmaBuf(t *testing.T) {
	needGPU(t)
	ca, _ := AllocatorFor(CUDA(0))
	buf, err := ca.Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	v, _ := buf.Slice(4096, 8192)
	fd, off, n, err := DmaBuf(v)
	if err != nil {
		t.Skipf("dmabuf export unavailable: %v", err)
	}
	defer syscall.Close(fd)
	if off != 4096 || n < 4<<20 {
		t.Errorf("offset %d length %d", off, n)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Error(err)
	}
}

func TestGPUOpenIPCGarbage(t *testing.T) {
	needGPU(t)
	var h IPCHandle
	for i := range h.Handle {
		h.Handle[i] = byte(i*7 + 1)
	}
	h.Size = 1 << 20
	if b, err := OpenIPC(CUDA(0), h); err == nil {
		b.Free()
		t.Fatal("OpenIPC of a made-up handle succeeded")
	} else {
		t.Logf("made-up handle: %v", err)
	}
	if _, err := OpenIPC(CUDA(0), IPCHandle{}); err == nil {
		t.Fatal("OpenIPC of a zero handle succeeded")
	}
}
