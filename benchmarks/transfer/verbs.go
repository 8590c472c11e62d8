package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/verbs"
	"github.com/tensorferry/tensorferry/tensor"
)

// Paths of the verbs channel alone (--channel verbs): an owner and a
// fetcher channel in one process, control messages handed over directly,
// the fetcher's Fetch timed with one RDMA device (NIC) and with two, each
// transfer split in slices over the rails.
const (
	pathVerbs1 = "verbs-1-nic"
	pathVerbs2 = "verbs-2-nics"
)

// verbsRailMin is the smallest slice per rail of the two-NIC path: small
// enough that 1 MiB (the VM's largest size) splits.
const verbsRailMin = 256 << 10

// verbsPair is an owner and a fetcher verbs channel of one process; the
// owner exports tensors on src, the fetcher reads them into dst.
type verbsPair struct {
	name             string
	src, dst         memory.Device
	owner, fetcher   *verbs.Channel
	ownerS, fetcherS *tensor.Store
	mu               sync.Mutex
	chans            map[string]*verbs.Channel
}

// openVerbsPair opens the pair with the given rails (one: nic, or the
// first usable device when nic is ""); it fails when this host has fewer
// usable RDMA devices.
func openVerbsPair(name string, rails int, nic string, src, dst memory.Device) (*verbsPair, error) {
	p := &verbsPair{name: name, src: src, dst: dst, ownerS: tensor.NewStore("owner", 1), fetcherS: tensor.NewStore("fetcher", 1),
		chans: map[string]*verbs.Channel{}}
	envOf := func(node string, s *tensor.Store) *rdma.Env {
		return &rdma.Env{Node: node, Incarnation: 1, Store: s,
			Control: func(ctx context.Context, to, channel string, req []byte) ([]byte, error) {
				p.mu.Lock()
				ch := p.chans[to]
				p.mu.Unlock()
				if ch == nil || channel != rdma.Verbs {
					return nil, fmt.Errorf("no node %q", to)
				}
				return ch.HandleControl(ctx, node, req)
			}}
	}
	cfg := verbs.Config{Rails: rails, RailMinBytes: verbsRailMin}
	if rails == 1 {
		cfg.Device = nic
	}
	var err error
	if p.owner, err = verbs.NewWithConfig(envOf("owner", p.ownerS), cfg); err != nil {
		return nil, errors.Join(err, p.close())
	}
	if p.fetcher, err = verbs.NewWithConfig(envOf("fetcher", p.fetcherS), cfg); err != nil {
		return nil, errors.Join(err, p.close())
	}
	p.mu.Lock()
	p.chans["owner"], p.chans["fetcher"] = p.owner, p.fetcher
	p.mu.Unlock()
	if got := len(p.fetcher.Rails()); got < rails {
		return nil, errors.Join(fmt.Errorf("%s: %d RDMA device(s) here (%v), want %d", name, got, p.fetcher.Rails(), rails), p.close())
	}
	return p, nil
}

// fetch exports x from the owner, times the fetcher's Fetch into dst and
// releases the export.
func (p *verbsPair) fetch(x *tensor.Tensor, dst memory.Buffer, timeout time.Duration) (time.Duration, error) {
	e, d, err := p.ownerS.Export(x, "fetcher", 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = p.ownerS.Release(d.ExportID, d.Lease) }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	o, err := p.owner.Offer(ctx, e, "fetcher")
	if err != nil {
		return 0, err
	}
	d.Offers = map[string][]byte{rdma.Verbs: o}
	t0 := time.Now()
	if err := p.fetcher.Fetch(ctx, d, dst); err != nil {
		return 0, fmt.Errorf("%s: %w", p.name, err)
	}
	return time.Since(t0), nil
}

func (p *verbsPair) close() error {
	var errs []error
	for _, c := range []*verbs.Channel{p.fetcher, p.owner} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	p.ownerS.Close()
	p.fetcherS.Close()
	return errors.Join(errs...)
}

// verbsBuffers are the source tensor and destination buffer of the verbs
// pair paths at one size.
type verbsBuffers struct {
	src *tensor.Tensor // x itself when on the host, else a copy on src
	dst memory.Buffer
	own bool // src is a copy to free
}

// newVerbsBuffers puts x's bytes on src and allocates a destination of the
// same size on dst.
func newVerbsBuffers(x *tensor.Tensor, src, dst memory.Device) (*verbsBuffers, error) {
	v := &verbsBuffers{src: x}
	if !src.IsHost() {
		t, err := x.To(context.Background(), src)
		if err != nil {
			return nil, err
		}
		v.src, v.own = t, true
	}
	b, err := memory.AllocUninit(dst, int(x.ByteSize()))
	if err != nil {
		v.free()
		return nil, err
	}
	v.dst = b
	return v, nil
}

// check compares the destination's CRC-32 with sum.
func (v *verbsBuffers) check(sum uint32) error {
	host := v.dst.Host()
	if host == nil {
		h, err := memory.NewHostBuffer(v.dst.Len())
		if err != nil {
			return err
		}
		defer h.Free()
		if err := memory.Copy(context.Background(), h, v.dst); err != nil {
			return err
		}
		host = h.Host()
	}
	if crc32.ChecksumIEEE(host) != sum {
		return errors.New("the fetched bytes differ")
	}
	return nil
}

func (v *verbsBuffers) free() {
	if v.own {
		_ = v.src.Free()
	}
	if v.dst != nil {
		_ = v.dst.Free()
	}
}
