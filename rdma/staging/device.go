package staging

import (
	"context"
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
)

// deviceSource stages the chunks of a device-memory export in host memory
// for the owner: next returns chunk after chunk, in order, while the copies
// of the following chunks (up to the window) run.
type deviceSource interface {
	// next returns the next chunk's offset (from the start of the range) and
	// bytes; p is valid until the following call to next or close.
	next(ctx context.Context) (off int, p []byte, err error)
	close()
}

// deviceSink is the fetcher's side for a device-memory destination: each
// chunk is read from the socket into a host slot and copied on to the
// device while the next chunk is read.
type deviceSink interface {
	// slot returns a host buffer of at least n bytes for the next chunk,
	// waiting until the copy that last used it has finished.
	slot(ctx context.Context, n int) ([]byte, error)
	// commit copies the first n bytes of the slot last returned into the
	// destination at off.
	commit(ctx context.Context, off, n int) error
	// finish waits until every committed copy is complete.
	finish(ctx context.Context) error
	close()
}

// newDeviceSource returns the owner's D2H stage for src: the connection's
// pinned ring pipelined on a stream when the CUDA backend offers one, else
// (no stream for the device) a synchronous copy through one buffer.
func newDeviceSource(r **pinnedRing, src memory.Buffer, chunk, window int) (deviceSource, error) {
	pr, err := ring(r, src.Device(), chunk, window)
	if err != nil {
		if errors.Is(err, memory.ErrNotSupported) {
			return newSyncSource(src, chunk, window)
		}
		return nil, err
	}
	return newRingSource(pr, src, chunk, window), nil
}

// newDeviceSink returns the fetcher's H2D stage for dst, like
// newDeviceSource.
func newDeviceSink(r **pinnedRing, dst memory.Buffer, chunk, window int) (deviceSink, error) {
	pr, err := ring(r, dst.Device(), chunk, window)
	if err != nil {
		if errors.Is(err, memory.ErrNotSupported) {
			return newSyncSink(dst, chunk, window)
		}
		return nil, err
	}
	return newRingSink(pr, dst, window), nil
}

// stagingBuffer allocates a host buffer for staging: pinned when the CUDA
// backend offers it (so device copies run at full speed), else pageable.
func stagingBuffer(n int) (memory.Buffer, error) {
	if a, err := memory.AllocatorFor(memory.Pinned); err == nil {
		if b, err := a.Alloc(n); err == nil {
			return b, nil
		}
	}
	return memory.NewHostBuffer(n)
}

// syncSource copies one chunk at a time with memory.Copy.
type syncSource struct {
	src         memory.Buffer // the range to send
	chunk, done int
	buf         memory.Buffer
}

func newSyncSource(src memory.Buffer, chunk, window int) (deviceSource, error) {
	n := min(chunk, src.Len())
	buf, err := stagingBuffer(max(n, 1))
	if err != nil {
		return nil, fmt.Errorf("staging: staging buffer: %w", err)
	}
	return &syncSource{src: src, chunk: chunk, buf: buf}, nil
}

func (s *syncSource) next(ctx context.Context) (int, []byte, error) {
	n := min(s.chunk, s.src.Len()-s.done)
	part, err := s.src.Slice(s.done, n)
	if err != nil {
		return 0, nil, err
	}
	slot, err := s.buf.Slice(0, n)
	if err != nil {
		return 0, nil, err
	}
	if err := memory.Copy(ctx, slot, part); err != nil {
		return 0, nil, fmt.Errorf("staging: device to host copy: %w", err)
	}
	off := s.done
	s.done += n
	return off, slot.Host(), nil
}

func (s *syncSource) close() { _ = s.buf.Free() }

// syncSink copies each chunk to the device before the next is read.
type syncSink struct {
	dst memory.Buffer
	buf memory.Buffer
}

func newSyncSink(dst memory.Buffer, chunk, window int) (deviceSink, error) {
	buf, err := stagingBuffer(max(min(chunk, dst.Len()), 1))
	if err != nil {
		return nil, fmt.Errorf("staging: staging buffer: %w", err)
	}
	return &syncSink{dst: dst, buf: buf}, nil
}

func (s *syncSink) slot(_ context.Context, n int) ([]byte, error) {
	if n > s.buf.Len() {
		return nil, fmt.Errorf("staging: chunk of %d bytes > staging slot of %d", n, s.buf.Len())
	}
	return s.buf.Host()[:n], nil
}

func (s *syncSink) commit(ctx context.Context, off, n int) error {
	d, err := s.dst.Slice(off, n)
	if err != nil {
		return err
	}
	src, err := s.buf.Slice(0, n)
	if err != nil {
		return err
	}
	if err := memory.Copy(ctx, d, src); err != nil {
		return fmt.Errorf("staging: host to device copy: %w", err)
	}
	return nil
}

func (s *syncSink) finish(context.Context) error { return nil }
func (s *syncSink) close()                       { _ = s.buf.Free() }
