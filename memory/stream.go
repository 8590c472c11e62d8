package memory

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorferry/tensorferry/internal/cuda"
)

// ErrClosed is returned by a Stream or Event used after Close.
var ErrClosed = errors.New("memory: stream or event closed")

// Stream is an ordered queue of copies on one CUDA device, for pipelines
// that overlap stages (D2H of one chunk while the previous one is on the
// wire). Work on one stream runs in order; work on different streams may
// overlap, and Events order it across streams. A Stream is safe for
// concurrent use; Close must come after the last use.
type Stream struct {
	d *cudaDevice

	mu sync.RWMutex // Close takes it exclusively
	s  *cuda.Stream // nil once closed
}

// NewStream creates a stream on a CUDA device. It returns an error matching
// ErrNotSupported without a usable device.
func NewStream(dev Device) (*Stream, error) {
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return nil, err
	}
	s, err := d.ctx.NewStream()
	if err != nil {
		return nil, fmt.Errorf("memory: %s: %w", dev, err)
	}
	return &Stream{d: d, s: s}, nil
}

// Device returns the stream's device.
func (s *Stream) Device() Device { return s.d.dev }

// CopyAsync enqueues a copy of all of src into the start of dst, where at
// least one of them is CUDA memory and a CUDA side is on the stream's device.
// It returns once the copy is queued; the buffers must stay alive and
// unchanged until the stream is synchronized or an event recorded after it
// completes.
//
// Host memory: pinned buffers (KindPinned) are copied asynchronously.
// Ordinary host memory (KindHost) is Go memory, which the driver may only
// use while a call lasts, so its copy is queued in order and waited for
// before CopyAsync returns (the driver stages pageable memory anyway).
// Copies between two host buffers wait for the stream, then copy.
func (s *Stream) CopyAsync(dst, src Buffer) error {
	if dst.Len() < src.Len() {
		return fmt.Errorf("%w: destination %d bytes < source %d bytes", ErrOutOfRange, dst.Len(), src.Len())
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return ErrClosed
	}
	n := src.Len()
	if n == 0 {
		return nil
	}
	dk, sk := dst.Device().Kind, src.Device().Kind
	onStream := func(b Buffer) bool { return b.Device() == s.d.dev }
	c := s.d.ctx
	var err error
	switch {
	case dst.Device().IsHost() && src.Device().IsHost():
		if err = s.s.Synchronize(); err == nil {
			d, h := dst.Host(), src.Host()
			if d == nil || h == nil {
				return ErrFreed
			}
			copy(d, h)
		}
	case dk == KindCUDA && sk == KindCUDA:
		if !onStream(dst) && !onStream(src) {
			return fmt.Errorf("memory: stream on %s cannot copy %s -> %s", s.d.dev, src.Device(), dst.Device())
		}
		var dp, sp cuda.DevicePtr
		if dp, err = devicePtr(dst); err != nil {
			return err
		}
		if sp, err = devicePtr(src); err != nil {
			return err
		}
		if dst.Device() == src.Device() {
			err = c.MemcpyDtoDAsync(dp, sp, n, s.s)
			break
		}
		dd, derr := cudaDeviceFor(dst.Device())
		sd, serr := cudaDeviceFor(src.Device())
		if derr != nil || serr != nil {
			return errors.Join(derr, serr)
		}
		enablePeer(dd, sd)
		err = c.MemcpyPeerAsync(dp, dd.ctx, sp, sd.ctx, n, s.s)
	case dk == KindCUDA:
		if !onStream(dst) {
			return fmt.Errorf("memory: stream on %s cannot copy to %s", s.d.dev, dst.Device())
		}
		dp, perr := devicePtr(dst)
		h, pinned, herr := hostSide(src)
		if perr != nil || herr != nil {
			return errors.Join(perr, herr)
		}
		if pinned {
			err = c.MemcpyHtoDAsync(dp, unsafe.Pointer(&h[0]), n, s.s)
		} else {
			err = c.MemcpyHtoDWait(dp, unsafe.Pointer(&h[0]), n, s.s)
		}
	case sk == KindCUDA:
		if !onStream(src) {
			return fmt.Errorf("memory: stream on %s cannot copy from %s", s.d.dev, src.Device())
		}
		sp, perr := devicePtr(src)
		h, pinned, herr := hostSide(dst)
		if perr != nil || herr != nil {
			return errors.Join(perr, herr)
		}
		if pinned {
			err = c.MemcpyDtoHAsync(unsafe.Pointer(&h[0]), sp, n, s.s)
		} else {
			err = c.MemcpyDtoHWait(unsafe.Pointer(&h[0]), sp, n, s.s)
		}
	default:
		return fmt.Errorf("memory: copy %s -> %s: %w", src.Device(), dst.Device(), ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("memory: %s: %w", s.d.dev, err)
	}
	return nil
}

// Synchronize waits until all work queued on the stream is done.
func (s *Stream) Synchronize() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return ErrClosed
	}
	if err := s.s.Synchronize(); err != nil {
		return fmt.Errorf("memory: %s: %w", s.d.dev, err)
	}
	return nil
}

// Record makes e complete once the work queued on s so far is done.
func (s *Stream) Record(e *Event) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e.mu.RLock()
	defer e.mu.RUnlock()
	if s.s == nil || e.e == nil {
		return ErrClosed
	}
	if err := e.e.Record(s.s); err != nil {
		return fmt.Errorf("memory: %s: %w", s.d.dev, err)
	}
	return nil
}

// Wait makes work queued on s after this call wait until e completes,
// without blocking the caller. e may belong to another device.
func (s *Stream) Wait(e *Event) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e.mu.RLock()
	defer e.mu.RUnlock()
	if s.s == nil || e.e == nil {
		return ErrClosed
	}
	if err := s.s.WaitEvent(e.e); err != nil {
		return fmt.Errorf("memory: %s: %w", s.d.dev, err)
	}
	return nil
}

// Close waits for the queued work and releases the stream.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return ErrClosed
	}
	serr := s.s.Synchronize()
	derr := s.s.Destroy()
	s.s = nil
	if err := errors.Join(serr, derr); err != nil {
		return fmt.Errorf("memory: %s: %w", s.d.dev, err)
	}
	return nil
}

// Event marks a point in a stream's work (Stream.Record). It is safe for
// concurrent use; Close must come after the last use.
type Event struct {
	dev    Device
	timing bool // made by NewTimingEvent
	mu     sync.RWMutex
	e      *cuda.Event // nil once closed
}

// NewEvent creates an event on a CUDA device (without timing, which makes
// it cheap). An event that was never recorded counts as complete.
func NewEvent(dev Device) (*Event, error) { return newEvent(dev, false) }

// NewTimingEvent creates an event that also records when the device reached
// it, for ElapsedTime. Timing makes recording a little dearer: use NewEvent
// for events that only order work.
func NewTimingEvent(dev Device) (*Event, error) { return newEvent(dev, true) }

func newEvent(dev Device, timing bool) (*Event, error) {
	d, err := cudaDeviceFor(dev)
	if err != nil {
		return nil, err
	}
	flags := cuda.EventDisableTiming
	if timing {
		flags = cuda.EventDefault
	}
	e, err := d.ctx.NewEvent(flags)
	if err != nil {
		return nil, fmt.Errorf("memory: %s: %w", dev, err)
	}
	return &Event{dev: dev, timing: timing, e: e}, nil
}

// ElapsedTime returns the device time between two timing events (made by
// NewTimingEvent on one device), both recorded and complete: how long the
// work queued between them took, without the host's launch overhead. Its
// resolution is about half a microsecond. An event not yet complete gives
// an error (cuda's CUDA_ERROR_NOT_READY); Synchronize the end event first.
func ElapsedTime(start, end *Event) (time.Duration, error) {
	if !start.timing || !end.timing {
		return 0, errors.New("memory: ElapsedTime needs two events made by NewTimingEvent")
	}
	if start.dev != end.dev {
		return 0, fmt.Errorf("memory: ElapsedTime between events on %s and %s", start.dev, end.dev)
	}
	start.mu.RLock()
	defer start.mu.RUnlock()
	if end != start {
		end.mu.RLock()
		defer end.mu.RUnlock()
	}
	if start.e == nil || end.e == nil {
		return 0, ErrClosed
	}
	ms, err := cuda.ElapsedTime(start.e, end.e)
	if err != nil {
		return 0, fmt.Errorf("memory: %s: %w", start.dev, err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Device returns the event's device.
func (e *Event) Device() Device { return e.dev }

// Synchronize waits until the work recorded in e is done.
func (e *Event) Synchronize() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.e == nil {
		return ErrClosed
	}
	if err := e.e.Synchronize(); err != nil {
		return fmt.Errorf("memory: %s: %w", e.dev, err)
	}
	return nil
}

// Query reports whether the work recorded in e is done, without blocking.
func (e *Event) Query() (done bool, err error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.e == nil {
		return false, ErrClosed
	}
	done, err = e.e.Query()
	if err != nil {
		return false, fmt.Errorf("memory: %s: %w", e.dev, err)
	}
	return done, nil
}

// Close releases the event.
func (e *Event) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.e == nil {
		return ErrClosed
	}
	err := e.e.Destroy()
	e.e = nil
	if err != nil {
		return fmt.Errorf("memory: %s: %w", e.dev, err)
	}
	return nil
}
