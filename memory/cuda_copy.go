package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

func init() {
	RegisterCopier(KindCUDA, KindHost, copyH2D)
	RegisterCopier(KindCUDA, KindPinned, copyH2D)
	RegisterCopier(KindHost, KindCUDA, copyD2H)
	RegisterCopier(KindPinned, KindCUDA, copyD2H)
	RegisterCopier(KindCUDA, KindCUDA, copyD2D)
}

// copyChunk is the most bytes one driver call of Copy moves; the context is
// checked between chunks. Smaller chunks cost bandwidth (64 MiB chunks: 4 %
// less on an NVLink peer copy of 256 MiB, measured on 2 x H200).
const copyChunk = 256 << 20

// devicePtr returns the device address of a CUDA buffer, or ErrFreed.
func devicePtr(b Buffer) (cuda.DevicePtr, error) {
	if db, ok := b.(deviceBuffer); ok && db.isFreed() {
		return 0, ErrFreed
	}
	return cuda.DevicePtr(b.Ptr()), nil
}

// hostSide returns the bytes of a host or pinned buffer and whether they are
// pinned (and so usable by asynchronous copies).
func hostSide(b Buffer) ([]byte, bool, error) {
	h := b.Host()
	if h == nil {
		return nil, false, ErrFreed
	}
	return h, b.Device().Kind == KindPinned, nil
}

// run moves n bytes in chunks on a pooled stream of d: each chunk is
// enqueued by op(off, m); the stream is synchronized before run returns, also
// when the context is cancelled half way (the memory must no longer be in
// use), so the copy is complete or failed when run returns.
func (d *cudaDevice) run(ctx context.Context, n int, op func(s *cuda.Stream, off, m int) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := d.stream()
	if err != nil {
		return err
	}
	var opErr error
	for off := 0; off < n && opErr == nil; off += copyChunk {
		if off > 0 {
			if opErr = ctx.Err(); opErr != nil {
				break
			}
		}
		opErr = op(s, off, min(copyChunk, n-off))
	}
	if serr := s.Synchronize(); serr != nil {
		// A failed stream is not pooled again.
		_ = s.Destroy()
		return errors.Join(opErr, fmt.Errorf("memory: %s: %w", d.dev, serr))
	}
	d.putStream(s)
	if opErr != nil {
		if errors.Is(opErr, context.Canceled) || errors.Is(opErr, context.DeadlineExceeded) {
			return opErr
		}
		return fmt.Errorf("memory: %s: %w", d.dev, opErr)
	}
	return nil
}

func copyH2D(ctx context.Context, dst, src Buffer) error {
	d, err := cudaDeviceFor(dst.Device())
	if err != nil {
		return err
	}
	dp, err := devicePtr(dst)
	if err != nil {
		return err
	}
	h, pinned, err := hostSide(src)
	if err != nil {
		return err
	}
	return d.run(ctx, src.Len(), func(s *cuda.Stream, off, m int) error {
		p := unsafe.Pointer(&h[off])
		if pinned {
			return d.ctx.MemcpyHtoDAsync(dp+cuda.DevicePtr(off), p, m, s)
		}
		return d.ctx.MemcpyHtoDWait(dp+cuda.DevicePtr(off), p, m, s)
	})
}

func copyD2H(ctx context.Context, dst, src Buffer) error {
	d, err := cudaDeviceFor(src.Device())
	if err != nil {
		return err
	}
	sp, err := devicePtr(src)
	if err != nil {
		return err
	}
	h, pinned, err := hostSide(dst)
	if err != nil {
		return err
	}
	return d.run(ctx, src.Len(), func(s *cuda.Stream, off, m int) error {
		p := unsafe.Pointer(&h[off])
		if pinned {
			return d.ctx.MemcpyDtoHAsync(p, sp+cuda.DevicePtr(off), m, s)
		}
		return d.ctx.MemcpyDtoHWait(p, sp+cuda.DevicePtr(off), m, s)
	})
}

func copyD2D(ctx context.Context, dst, src Buffer) error {
	dd, err := cudaDeviceFor(dst.Device())
	if err != nil {
		return err
	}
	sd, err := cudaDeviceFor(src.Device())
	if err != nil {
		return err
	}
	dp, err := devicePtr(dst)
	if err != nil {
		return err
	}
	sp, err := devicePtr(src)
	if err != nil {
		return err
	}
	if dd != sd {
		enablePeer(dd, sd)
	}
	return dd.run(ctx, src.Len(), func(s *cuda.Stream, off, m int) error {
		o := cuda.DevicePtr(off)
		if dd == sd {
			return dd.ctx.MemcpyDtoDAsync(dp+o, sp+o, m, s)
		}
		return dd.ctx.MemcpyPeerAsync(dp+o, dd.ctx, sp+o, sd.ctx, m, s)
	})
}

var peers struct {
	mu   sync.Mutex
	done map[[2]int]error
}

// enablePeer enables peer access between two devices in both directions,
// once, when the hardware allows it; copies between them work either way
// (the driver stages through the host without peer access).
func enablePeer(a, b *cudaDevice) error {
	key := [2]int{min(a.dev.Index, b.dev.Index), max(a.dev.Index, b.dev.Index)}
	peers.mu.Lock()
	defer peers.mu.Unlock()
	if peers.done == nil {
		peers.done = map[[2]int]error{}
	}
	if err, ok := peers.done[key]; ok {
		return err
	}
	err := func() error {
		ok1, err := cuda.CanAccessPeer(a.dev.Index, b.dev.Index)
		if err != nil {
			return err
		}
		ok2, err := cuda.CanAccessPeer(b.dev.Index, a.dev.Index)
		if err != nil {
			return err
		}
		if !ok1 || !ok2 {
			return fmt.Errorf("memory: %s and %s cannot access each other's memory", a.dev, b.dev)
		}
		return errors.Join(a.ctx.EnablePeerAccess(b.ctx), b.ctx.EnablePeerAccess(a.ctx))
	}()
	peers.done[key] = err
	return err
}

// CanAccessPeer reports whether CUDA device a can address memory of CUDA
// device b directly (P2P over NVLink or PCIe), as the driver sees it; a
// device can always address its own. Without it, copies between the two
// still work, staged through the host by the driver.
func CanAccessPeer(a, b Device) (bool, error) {
	da, err := cudaDeviceFor(a)
	if err != nil {
		return false, err
	}
	db, err := cudaDeviceFor(b)
	if err != nil {
		return false, err
	}
	if da == db {
		return true, nil
	}
	ok, err := cuda.CanAccessPeer(da.dev.Index, db.dev.Index)
	if err != nil {
		return false, fmt.Errorf("memory: %s and %s: %w", a, b, err)
	}
	return ok, nil
}

// EnablePeerAccess lets two CUDA devices address each other's memory (P2P
// over NVLink or PCIe), in both directions. It is done once per pair; Copy
// and Stream.CopyAsync do it by themselves for device to device copies
// (and ignore its failure), so a program calls it only to learn early why
// peer access is impossible: the error says. Copies still work then,
// through the host.
func EnablePeerAccess(a, b Device) error {
	da, err := cudaDeviceFor(a)
	if err != nil {
		return err
	}
	db, err := cudaDeviceFor(b)
	if err != nil {
		return err
	}
	if da == db {
		return nil
	}
	return enablePeer(da, db)
}
