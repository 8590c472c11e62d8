package main

import (
	"errors"
	"sync"

	"github.com/tensorferry/tensorferry/benchmarks/internal/report"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// The reuse mode: one tensor to one receiver that reuses its destination
// (Node.WithDestinations), beside the same receiver allocating a new one
// and freeing it after use (as the ipc mode's messages do), at 4 MiB to
// 1 GiB: what fetching into a tensor the receiver has saves per message.
// NCCL's send/recv into a preallocated tensor (nccl_sendrecv.py) is the
// target.
const (
	pathReuse = "tensorferry-reuse" // into the receiver's destination
	// pathReuseStream is pathReuse with messages back to back (streamBatch
	// of them in flight), the way nccl_sendrecv.py times its iterations
	// into one preallocated tensor.
	pathReuseStream = "tensorferry-reuse-stream"
	pathAlloc       = "tensorferry-alloc" // into a new tensor, freed after use
	reuseSink       = "sink-reuse"        // the receiver's actor with destinations
)

// reuseSizes are the reuse mode's sizes, within the run's bounds.
var reuseSizes = []int{4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}

// destPool is the reuse sink's destinations: one tensor, of the shape of
// the last message. The mode sends one message at a time, so the previous
// destination is free when a message of another shape comes.
type destPool struct {
	dev memory.Device
	mu  sync.Mutex
	t   *tensor.Tensor
}

// get is the sink's Destinations.
func (p *destPool) get(msg any, d *tensor.Descriptor) *tensor.Tensor {
	if _, ok := msg.(*Msg); !ok {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t != nil && tensor.CheckDestination(p.t, d.DType, d.Shape) == nil {
		return p.t
	}
	if p.t != nil {
		_ = p.t.Free()
		p.t = nil
	}
	t, err := tensor.NewUninit(p.dev, d.DType, d.Shape)
	if err != nil {
		return nil // the node allocates, and fails the message with the reason
	}
	p.t = t
	return t
}

func (p *destPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t != nil {
		_ = p.t.Free()
		p.t = nil
	}
}

// runReuse times one message at a time from --src to --dst, alternating
// the receiver that reuses its destination and the one that allocates.
func runReuse(o options) (rs []report.Result, err error) {
	lo, hi := o.sizes[0], o.sizes[len(o.sizes)-1]
	o.sizes = nil
	for _, s := range reuseSizes {
		if s >= lo && s <= hi {
			o.sizes = append(o.sizes, s)
		}
	}
	if len(o.sizes) == 0 {
		return nil, errors.New("reuse: no size between --min and --max among 4MiB..1GiB")
	}
	src, dst := cudaDev(o.src), cudaDev(o.dst)
	return measureReuse(o, pairConfig{src: src, dst: dst, timeout: o.timeout, log: o.logs, readSpin: o.readSpin})
}

// measureReuse opens the pair of pc and measures the two paths.
func measureReuse(o options, pc pairConfig) (rs []report.Result, err error) {
	p, err := openPair(pc)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.close()) }()
	reuse := *p // the same nodes, to the other sink; closed through p
	reuse.sink = p.node.PID(p.sink.Address, reuseSink)
	paths := []pathMaker{actorPath(pathReuse, &reuse, pc.src), actorPath(pathAlloc, p, pc.src)}
	if !pc.dst.IsHost() {
		// Messages in flight at once write the one destination together,
		// as NCCL's iterations write one tensor: same bytes, copies on the
		// GPU's streams. In host memory that is a data race to the race
		// detector, so the host runs (tests) leave this path out.
		paths = append(paths, streamPath(pathReuseStream, &reuse, pc.src, 0))
	}
	return measure(o, paths)
}
