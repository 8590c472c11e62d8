package staging

import (
	"context"
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/memory"
)

// pinnedRing is a data connection's staging ring: window pinned host slots
// of chunk bytes each, allocated (and so registered with the driver) once
// per connection and reused by every transfer on it, plus a stream and one
// event per slot on the CUDA device currently in use.
//
// The slots are views of one pinned allocation whose pages are on the NUMA
// node of the GPU the ring serves (memory.PinnedAllocator.AllocOnNode), so
// the GPU's DMA and the CPU's socket copies stay on that node's memory
// instead of crossing the socket interconnect.
type pinnedRing struct {
	chunk  int
	node   int           // NUMA node of the slots' pages; -1 when unknown
	mem    memory.Buffer // the slots' memory
	slots  []memory.Buffer
	dev    memory.Device
	stream *memory.Stream
	events []*memory.Event
}

// ring returns *r if it fits (slots of at least chunk bytes, at least
// window of them, on dev's NUMA node when that is known) bound to dev,
// else replaces it with a new one.
func ring(r **pinnedRing, dev memory.Device, chunk, window int) (*pinnedRing, error) {
	node := memory.DeviceNUMANode(dev)
	if *r != nil && ((*r).chunk < chunk || len((*r).slots) < window || (node >= 0 && (*r).node != node)) {
		(*r).free()
		*r = nil
	}
	if *r == nil {
		nr, err := newPinnedRing(node, chunk, window)
		if err != nil {
			return nil, err
		}
		*r = nr
	}
	if err := (*r).bind(dev); err != nil {
		(*r).free()
		*r = nil
		return nil, err
	}
	return *r, nil
}

// newPinnedRing allocates window slots of chunk bytes on NUMA node (node
// < 0: wherever the allocator puts them).
func newPinnedRing(node, chunk, window int) (*pinnedRing, error) {
	if chunk <= 0 || window <= 0 {
		return nil, fmt.Errorf("staging: pinned ring of %d slots of %d bytes", window, chunk)
	}
	a, err := memory.PinnedAllocatorFor()
	if err != nil {
		return nil, err
	}
	mem, err := a.AllocOnNode(chunk*window, node)
	if err != nil {
		return nil, fmt.Errorf("staging: pinned ring: %w", err)
	}
	nr := &pinnedRing{chunk: chunk, node: node, mem: mem}
	for i := range window {
		s, err := mem.Slice(i*chunk, chunk)
		if err != nil {
			_ = mem.Free()
			return nil, err
		}
		nr.slots = append(nr.slots, s)
	}
	return nr, nil
}

// bind makes the ring's stream and events belong to dev.
func (r *pinnedRing) bind(dev memory.Device) error {
	if r.stream != nil && r.dev == dev {
		return nil
	}
	r.unbind()
	s, err := memory.NewStream(dev)
	if err != nil {
		return fmt.Errorf("staging: stream on %s: %w", dev, err)
	}
	r.dev, r.stream = dev, s
	for range r.slots {
		e, err := memory.NewEvent(dev)
		if err != nil {
			r.unbind()
			return fmt.Errorf("staging: event on %s: %w", dev, err)
		}
		r.events = append(r.events, e)
	}
	return nil
}

func (r *pinnedRing) unbind() {
	for _, e := range r.events {
		_ = e.Close()
	}
	r.events = nil
	if r.stream != nil {
		_ = r.stream.Close() // waits for the queued copies
		r.stream = nil
	}
}

// free waits for the ring's copies and gives its memory back.
func (r *pinnedRing) free() {
	if r == nil {
		return
	}
	r.unbind()
	if r.mem != nil {
		_ = r.mem.Free()
	}
	r.mem, r.slots = nil, nil
}

// slot returns the first n bytes of slot i as a buffer.
func (r *pinnedRing) slot(i, n int) (memory.Buffer, error) { return r.slots[i].Slice(0, n) }

// ringSource is the owner's D2H pipeline: chunk k is copied into slot
// k % window on the ring's stream, and an event recorded after it; next
// waits only for that chunk's event, so while the caller writes chunk k to
// the socket the copies of the following window-1 chunks run.
type ringSource struct {
	r             *pinnedRing
	src           memory.Buffer
	chunk, window int
	chunks        int
	cur           int // chunk returned by the last next; -1 before the first
}

func newRingSource(r *pinnedRing, src memory.Buffer, chunk, window int) *ringSource {
	return &ringSource{r: r, src: src, chunk: chunk, window: window, chunks: (src.Len() + chunk - 1) / chunk, cur: -1}
}

func (s *ringSource) issue(k int) error {
	off := k * s.chunk
	n := min(s.chunk, s.src.Len()-off)
	part, err := s.src.Slice(off, n)
	if err != nil {
		return err
	}
	slot, err := s.r.slot(k%s.window, n)
	if err != nil {
		return err
	}
	if err := s.r.stream.CopyAsync(slot, part); err != nil {
		return fmt.Errorf("staging: device to host copy: %w", err)
	}
	return s.r.stream.Record(s.r.events[k%s.window])
}

func (s *ringSource) next(ctx context.Context) (int, []byte, error) {
	if s.cur+1 >= s.chunks {
		return 0, nil, errors.New("staging: read past the last chunk")
	}
	if s.cur < 0 {
		for k := range min(s.window, s.chunks) {
			if err := s.issue(k); err != nil {
				return 0, nil, err
			}
		}
	} else if k := s.cur + s.window; k < s.chunks {
		// Chunk cur is on the socket: its slot takes the next chunk.
		if err := s.issue(k); err != nil {
			return 0, nil, err
		}
	}
	s.cur++
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	i := s.cur % s.window
	if err := s.r.events[i].Synchronize(); err != nil {
		return 0, nil, fmt.Errorf("staging: device to host copy: %w", err)
	}
	off := s.cur * s.chunk
	n := min(s.chunk, s.src.Len()-off)
	return off, s.r.slots[i].Host()[:n], nil
}

// close waits for the copies still queued, so that the ring can be reused
// and the export's acquisition ended.
func (s *ringSource) close() { _ = s.r.stream.Synchronize() }

// ringSink is the fetcher's H2D pipeline: chunk k is read from the socket
// into slot k % window and copied on to the destination asynchronously; the
// slot is reused only after its event says that copy is done, so the socket
// read of the next chunks overlaps the copies of the previous ones.
type ringSink struct {
	r      *pinnedRing
	dst    memory.Buffer
	window int
	k      int // chunks committed
}

func newRingSink(r *pinnedRing, dst memory.Buffer, window int) *ringSink {
	return &ringSink{r: r, dst: dst, window: window}
}

func (s *ringSink) slot(_ context.Context, n int) ([]byte, error) {
	if n > s.r.chunk {
		return nil, fmt.Errorf("staging: chunk of %d bytes > staging slot of %d", n, s.r.chunk)
	}
	i := s.k % s.window
	if s.k >= s.window {
		if err := s.r.events[i].Synchronize(); err != nil {
			return nil, fmt.Errorf("staging: host to device copy: %w", err)
		}
	}
	return s.r.slots[i].Host()[:n], nil
}

func (s *ringSink) commit(_ context.Context, off, n int) error {
	i := s.k % s.window
	d, err := s.dst.Slice(off, n)
	if err != nil {
		return err
	}
	src, err := s.r.slot(i, n)
	if err != nil {
		return err
	}
	if err := s.r.stream.CopyAsync(d, src); err != nil {
		return fmt.Errorf("staging: host to device copy: %w", err)
	}
	if err := s.r.stream.Record(s.r.events[i]); err != nil {
		return fmt.Errorf("staging: host to device copy: %w", err)
	}
	s.k++
	return nil
}

func (s *ringSink) finish(context.Context) error {
	if err := s.r.stream.Synchronize(); err != nil {
		return fmt.Errorf("staging: host to device copy: %w", err)
	}
	return nil
}

// close waits for the copies still queued: the destination and the slots
// must not be touched by the device after the transfer returns.
func (s *ringSink) close() { _ = s.r.stream.Synchronize() }
