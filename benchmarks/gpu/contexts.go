package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
)

// The contexts mode asks what a second process's CUDA context on the same
// GPU costs a neighbour's copies, with no runtime of ours in that process:
// copy+sync of each size, alone, then while another process holds a
// context on --dst (a buffer allocated, nothing running), while that
// process copies 4 KiB every millisecond (a context that ran a moment
// ago, as the other end of a message has), and while it copies in a
// loop; last, taking turns with it: the other process copies 4 KiB
// right after each of this one's copies (what the two ends of a message
// do), timed as the round of both copies and the two pipe hops. On one GPU without MPS the contexts of two processes time-slice;
// the ipc mode's messages pay that between their two processes.
const (
	holderEnv       = "TF_GPU_BENCH_HOLDER" // "idle:N", "tick:N", "busy:N", "turns:N", "ranonce:N" or "mapped:N:HANDLE": hold a context on cuda:N
	pathCopyIdleCtx = "copy+sync-idle-context"
	// The idle neighbour after one copy of its own, and after one copy
	// from this process's memory mapped through CUDA IPC (what the
	// receiver of an ipc message has done): which of the two leaves it
	// costing this process's copies.
	pathCopyRanOnceCtx = "copy+sync-ran-once-context"
	pathCopyMappedCtx  = "copy+sync-ipc-mapped-context"
	// The idle neighbour after copying from the mapping as the ipc
	// channel's fetcher does: on a stream of its own, each copy followed
	// by an event it polls, 1000 times.
	pathCopyLaneCtx  = "copy+sync-ipc-lane-context"
	pathCopyTickCtx  = "copy+sync-ticking-context"
	pathTurns        = "copy+sync-taking-turns"
	pathCopyBusyCtx  = "copy+sync-busy-context"
	holderBufferSize = 64 << 20
)

func isHolder() bool { return os.Getenv(holderEnv) != "" }

// runHolder is the second process: it allocates a buffer on its GPU (and,
// busy, copies within it in a loop), prints "ready", and exits when its
// standard input closes.
func runHolder() {
	if err := hold(os.Getenv(holderEnv), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gpu: holder: %v\n", err)
		os.Exit(1)
	}
}

func hold(spec string, in io.Reader, out io.Writer) error {
	kind, ordinal, ok := strings.Cut(spec, ":")
	ordinal, handle, _ := strings.Cut(ordinal, ":")
	n, err := strconv.Atoi(ordinal)
	if !ok || err != nil || (kind != "idle" && kind != "tick" && kind != "busy" && kind != "turns" && kind != "ranonce" && kind != "mapped" && kind != "lane") {
		return fmt.Errorf("bad %s %q", holderEnv, spec)
	}
	buf, err := memory.AllocUninit(memory.CUDA(n), 2*holderBufferSize)
	if err != nil {
		return err
	}
	defer buf.Free()
	a, err := buf.Slice(0, holderBufferSize)
	if err != nil {
		return err
	}
	b, err := buf.Slice(holderBufferSize, holderBufferSize)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	switch kind {
	case "busy", "tick":
		if kind == "tick" {
			if a, err = a.Slice(0, 4<<10); err == nil {
				b, err = b.Slice(0, 4<<10)
			}
			if err != nil {
				return err
			}
		}
		go func() {
			for ctx.Err() == nil {
				if err := memory.Copy(ctx, b, a); err != nil && ctx.Err() == nil {
					done <- err
					return
				}
				if kind == "tick" {
					time.Sleep(time.Millisecond)
				}
			}
			done <- nil
		}()
	case "ranonce", "mapped", "lane":
		from := a
		if kind != "ranonce" {
			var h memory.IPCHandle
			raw, err := hex.DecodeString(handle)
			if err != nil || len(raw) != len(h.Handle)+8 {
				return fmt.Errorf("bad IPC handle in %s", holderEnv)
			}
			copy(h.Handle[:], raw)
			h.Size = int(binary.LittleEndian.Uint64(raw[len(h.Handle):]))
			m, err := memory.OpenIPC(memory.CUDA(n), h)
			if err != nil {
				return err
			}
			defer m.Free()
			from = m
		}
		if from, err = from.Slice(0, 4<<10); err == nil {
			b, err = b.Slice(0, 4<<10)
		}
		if err == nil && kind == "lane" {
			err = fetcherCopies(b, from, 1000)
		} else if err == nil {
			err = memory.Copy(ctx, b, from)
		}
		if err != nil {
			return err
		}
		done <- nil
	case "turns":
		fmt.Fprintln(out, "ready")
		a, _ = a.Slice(0, 4<<10) // within a 64 MiB buffer: cannot fail
		b, _ = b.Slice(0, 4<<10)
		var one [1]byte
		for {
			if _, err := io.ReadFull(in, one[:]); err != nil {
				return nil // the parent is done
			}
			if err := memory.Copy(ctx, b, a); err != nil {
				return err
			}
			if _, err := out.Write(one[:]); err != nil {
				return err
			}
		}
	default:
		done <- nil
	}
	fmt.Fprintln(out, "ready")
	_, _ = io.Copy(io.Discard, in)
	cancel()
	return <-done
}

// holder is the second process.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startHolder starts the second process and waits for its "ready".
func startHolder(spec string) (*holder, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), holderEnv+"="+spec)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &holder{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line, err := h.out.ReadString('\n')
	if err != nil || line != "ready\n" {
		return nil, errors.Join(fmt.Errorf("holder did not start: %q", line), err, h.stop())
	}
	return h, nil
}

func (h *holder) stop() error { _ = h.stdin.Close(); return h.cmd.Wait() }

// turnsPath copies n bytes in this process, then has the holder copy 4 KiB
// and answer: one turn of each context.
func turnsPath(h *holder, src, dst memory.Device) pathMaker {
	cp := copySyncPath(pathTurns, src, dst)
	return pathMaker{name: pathTurns, make: func(n int) (stepper, error) {
		s, err := cp.make(n)
		if err != nil {
			return nil, err
		}
		return &turnStepper{copyStepper: s.(*copyStepper), h: h}, nil
	}}
}

type turnStepper struct {
	*copyStepper
	h *holder
}

func (s *turnStepper) step(check, timed bool) (time.Duration, error) {
	t0 := time.Now()
	if _, err := s.copyStepper.step(check, timed); err != nil {
		return 0, err
	}
	var one [1]byte
	if _, err := s.h.stdin.Write(one[:]); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(s.h.out, one[:]); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// runContexts measures copy+sync alone, beside an idle, a ticking and a
// busy context, and taking turns with one.
func runContexts(o options) (rs []report.Result, err error) {
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	alone, err := measure(o, []pathMaker{copySyncPath(pathCopySync, src, dst)})
	rs = append(rs, alone...)
	if err != nil {
		return rs, err
	}
	// A buffer of this process that the "mapped" neighbour opens.
	exported, err := memory.AllocUninit(src, holderBufferSize)
	if err != nil {
		return rs, err
	}
	defer exported.Free()
	h, _, err := memory.ExportIPC(exported)
	if err != nil {
		return rs, err
	}
	mapped := hex.EncodeToString(binary.LittleEndian.AppendUint64(h.Handle[:], uint64(h.Size)))
	for _, c := range []struct{ spec, path string }{
		{"idle:" + strconv.Itoa(o.dst), pathCopyIdleCtx},
		{"tick:" + strconv.Itoa(o.dst), pathCopyTickCtx},
		{"busy:" + strconv.Itoa(o.dst), pathCopyBusyCtx},
		{"turns:" + strconv.Itoa(o.dst), pathTurns},
		{"ranonce:" + strconv.Itoa(o.dst), pathCopyRanOnceCtx},
		{"mapped:" + strconv.Itoa(o.dst) + ":" + mapped, pathCopyMappedCtx},
		{"lane:" + strconv.Itoa(o.dst) + ":" + mapped, pathCopyLaneCtx},
	} {
		h, err := startHolder(c.spec)
		if err != nil {
			return rs, err
		}
		p := copySyncPath(c.path, src, dst)
		if c.path == pathTurns {
			p = turnsPath(h, src, dst)
		}
		got, err := measure(o, []pathMaker{p})
		rs = append(rs, got...)
		if err = errors.Join(err, h.stop()); err != nil {
			return rs, err
		}
	}
	return rs, nil
}

// fetcherCopies copies src to dst n times the way the ipc channel's
// fetcher does: on a stream of its own, each copy followed by an event
// that it polls until done. The stream and events stay open (as the
// fetcher's idle lanes do).
func fetcherCopies(dst, src memory.Buffer, n int) error {
	s, err := memory.NewStream(dst.Device())
	if err != nil {
		return err
	}
	ev, err := memory.NewEvent(dst.Device())
	if err != nil {
		return err
	}
	for range n {
		if err := s.CopyAsync(dst, src); err != nil {
			return err
		}
		if err := s.Record(ev); err != nil {
			return err
		}
		for {
			done, err := ev.Query()
			if err != nil {
				return err
			}
			if done {
				break
			}
			runtime.Gosched()
		}
	}
	return nil
}
