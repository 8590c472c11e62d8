package memory

import (
	"context"
	"fmt"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// Fill sets every byte of buf to v. The CPU sets host and pinned memory;
// the device sets CUDA memory (cuMemsetD8Async on a stream of the package's
// own, in chunks between which ctx is checked), complete when Fill
// returns, as a Copy is.
func Fill(ctx context.Context, buf Buffer, v byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if buf.Device().IsHost() {
		h := buf.Host()
		if h == nil && buf.Len() > 0 {
			return ErrFreed
		}
		if len(h) > 0 {
			h[0] = v
			for n := 1; n < len(h); n *= 2 { // doubling copies: memmove speed
				copy(h[n:], h[:n])
			}
		}
		return nil
	}
	if buf.Device().Kind != KindCUDA {
		return fmt.Errorf("memory: fill on %s: %w", buf.Device(), ErrNotSupported)
	}
	d, err := cudaDeviceFor(buf.Device())
	if err != nil {
		return err
	}
	p, err := devicePtr(buf)
	if err != nil {
		return err
	}
	return d.run(ctx, buf.Len(), func(s *cuda.Stream, off, m int) error {
		return d.ctx.MemsetD8Async(p+cuda.DevicePtr(off), v, m, s)
	})
}
