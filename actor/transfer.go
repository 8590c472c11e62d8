package actor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// encodeSession exports the tensors of one outgoing message.
type encodeSession struct {
	n       *Node
	peer    string
	exports []*tensor.Export
	fetched []*tensor.Export // those the peer fetches before delivery (not Refs)
}

var _ tensor.EncodeSession = (*encodeSession)(nil)

func (s *encodeSession) ExportTensor(t *tensor.Tensor, asRef bool) (*tensor.Descriptor, error) {
	if !asRef && t.ByteSize() <= int64(s.n.cfg.InlineThreshold) {
		return nil, nil
	}
	ttl := s.n.cfg.TransferTimeout
	if asRef {
		ttl = s.n.opts.refTTL
	}
	e, d, err := s.n.store.Export(t, s.peer, ttl)
	if err != nil {
		return nil, err
	}
	s.exports = append(s.exports, e)
	if !asRef {
		s.fetched = append(s.fetched, e)
	}
	ctx, cancel := context.WithTimeout(s.n.ctx, s.n.cfg.TransferTimeout)
	defer cancel()
	for name, ch := range s.n.channels {
		offer, err := ch.Offer(ctx, e, s.peer)
		if err != nil {
			s.n.log.Debug("channel makes no offer", zap.String("channel", name), zap.Error(err))
			continue
		}
		if offer != nil {
			if d.Offers == nil {
				d.Offers = map[string][]byte{}
			}
			d.Offers[name] = offer
		}
	}
	s.n.stats.TensorsExported.Add(1)
	return d, nil
}

// rollback ends the leases of a message that was not sent.
func (s *encodeSession) rollback() {
	for _, e := range s.exports {
		_ = s.n.store.Release(e.ID, e.Lease)
	}
	s.exports, s.fetched = nil, nil
}

type fetchJob struct {
	d   *tensor.Descriptor
	dst *tensor.Tensor
}

// decodeSession materializes the tensors of one incoming message on the
// receiving actor's device.
type decodeSession struct {
	n       *Node
	peer    string
	device  memory.Device
	fetches []fetchJob
	made    []*tensor.Tensor
	refs    []tensor.Ref
}

var _ tensor.DecodeSession = (*decodeSession)(nil)

// decodeSessionFor returns the session for decoding a message of the named
// type to actor id, or nil when the type carries no tensors (the common,
// small message: no allocation, no device lookup).
func (n *Node) decodeSessionFor(typeName, peer, id string) *decodeSession {
	if typ, ok := registry.Lookup(typeName); ok && !carriesTensors(typ) {
		return nil
	}
	return &decodeSession{n: n, peer: peer, device: n.deviceOf(id)}
}

// empty reports whether the session has nothing to fetch.
func (s *decodeSession) empty() bool { return s == nil || len(s.fetches) == 0 }

func (s *decodeSession) InlineTensor(dt tensor.DType, shape tensor.Shape, data []byte) (*tensor.Tensor, error) {
	t, err := tensor.New(s.device, dt, shape)
	if err != nil {
		return nil, err
	}
	if err := memory.Copy(s.n.ctx, t.Buffer(), memory.WrapHost(data)); err != nil {
		_ = t.Free()
		return nil, err
	}
	s.made = append(s.made, t)
	return t, nil
}

func (s *decodeSession) ImportTensor(d *tensor.Descriptor) (*tensor.Tensor, error) {
	// Every descriptor is remembered first, so that its lease is released
	// even when allocation or a later field fails.
	s.fetches = append(s.fetches, fetchJob{d: d})
	t, err := tensor.NewUninit(s.device, d.DType, d.Shape)
	if err != nil {
		return nil, err
	}
	s.fetches[len(s.fetches)-1].dst = t
	s.made = append(s.made, t)
	return t, nil
}

func (s *decodeSession) ImportRef(d *tensor.Descriptor) (tensor.Ref, error) {
	r := tensor.RefFromDescriptor(d, (*fetcher)(s.n))
	s.refs = append(s.refs, r)
	return r, nil
}

// fetchAll fetches every descriptor of the message, releasing each lease.
func (s *decodeSession) fetchAll(ctx context.Context) error {
	if s == nil {
		return nil
	}
	var first error
	for i, j := range s.fetches {
		if first == nil {
			first = s.n.fetchInto(ctx, j.d, j.dst)
		}
		if err := s.n.release(ctx, j.d); err != nil && first == nil {
			first = err
		}
		s.fetches[i].dst = nil
	}
	s.fetches = nil
	if first != nil {
		s.freeTensors()
		for _, r := range s.refs {
			_ = r.Release(ctx)
		}
	}
	return first
}

// abort releases every lease of a message that will not be delivered.
func (s *decodeSession) abort(ctx context.Context) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	for _, j := range s.fetches {
		_ = s.n.release(ctx, j.d)
	}
	s.fetches = nil
	for _, r := range s.refs {
		_ = r.Release(ctx)
	}
	s.freeTensors()
}

func (s *decodeSession) freeTensors() {
	if s == nil {
		return
	}
	for _, t := range s.made {
		_ = t.Free()
	}
	s.made = nil
}

// fetcher is the tensor.Fetcher of Refs delivered by a node.
type fetcher Node

func (f *fetcher) FetchDescriptor(ctx context.Context, d *tensor.Descriptor, dev memory.Device) (*tensor.Tensor, error) {
	n := (*Node)(f)
	t, err := tensor.NewUninit(dev, d.DType, d.Shape)
	if err != nil {
		return nil, err
	}
	if err := n.fetchInto(ctx, d, t); err != nil {
		_ = t.Free()
		return nil, err
	}
	return t, nil
}

func (f *fetcher) ReleaseDescriptor(ctx context.Context, d *tensor.Descriptor) error {
	return (*Node)(f).release(ctx, d)
}

// ErrNoChannel is returned when no data channel can move a tensor between
// the owner's and the receiver's devices.
var ErrNoChannel = errors.New("actor: no data channel for this transfer")

// ownerCaps returns the capabilities of a descriptor's owner, checking that
// the descriptor comes from the owner's current incarnation.
func (n *Node) ownerCaps(d *tensor.Descriptor) (*rdma.Caps, error) {
	if d.Owner == n.self.Name {
		if d.Incarnation != n.incarnation {
			return nil, fmt.Errorf("%w: %s", tensor.ErrStale, d)
		}
		return &n.caps, nil
	}
	ps := n.peer(d.Owner)
	if ps == nil {
		return nil, fmt.Errorf("%w: owner %s of %v", ErrNodeDown, d.Owner, d)
	}
	if ps.caps.Incarnation != d.Incarnation {
		return nil, fmt.Errorf("%w: %s is now incarnation %d", tensor.ErrStale, d, ps.caps.Incarnation)
	}
	return &ps.caps, nil
}

// Route returns the channel that would move a tensor of owner's device src
// to this node's device dst, with the reasons for the others.
func (n *Node) Route(owner string, src, dst memory.Device) (rdma.Choice, error) {
	oc := &n.caps
	if owner != n.self.Name {
		ps := n.peer(owner)
		if ps == nil {
			return rdma.Choice{}, fmt.Errorf("%w: %s", ErrNodeDown, owner)
		}
		oc = &ps.caps
	}
	return rdma.Select(oc, &n.caps, src, dst), nil
}

func (n *Node) fetchInto(ctx context.Context, d *tensor.Descriptor, dst *tensor.Tensor) error {
	oc, err := n.ownerCaps(d)
	if err != nil {
		return err
	}
	src, err := memory.ParseDevice(d.Device)
	if err != nil {
		return err
	}
	choice := rdma.Select(oc, n.fetcherCaps(d), src, dst.Device())
	ch := n.channels[choice.Channel]
	if ch == nil {
		return fmt.Errorf("%w: %s -> %s: %v", ErrNoChannel, src, dst.Device(), choice.Rejected)
	}
	start := time.Now()
	if err := ch.Fetch(ctx, d, dst.Buffer()); err != nil {
		return fmt.Errorf("actor: fetch %v over %s: %w", d, choice.Channel, err)
	}
	n.stats.addBytes(choice.Channel, d.Bytes, time.Since(start))
	return nil
}

// holderBound lists the channels that serve an export only to the node its
// lease was issued to (they hand out a per-peer IPC handle or RDMA key).
var holderBound = []string{rdma.IPC, rdma.Verbs}

// fetcherCaps returns this node's capabilities for fetching d: all of them,
// except, for a descriptor that was forwarded here (this node is not its
// holder), the channels bound to the holder.
func (n *Node) fetcherCaps(d *tensor.Descriptor) *rdma.Caps {
	if d.Holder == "" || d.Holder == n.self.Name {
		return &n.caps
	}
	c := n.caps
	c.Channels = slices.DeleteFunc(slices.Clone(c.Channels), func(ch string) bool { return slices.Contains(holderBound, ch) })
	c.NotRunning = maps.Clone(c.NotRunning)
	for _, ch := range holderBound {
		if n.caps.Runs(ch) {
			c.NotRunning[ch] = "forwarded descriptor (lent to " + d.Holder + "): served only to its holder"
		}
	}
	return &c
}

// release ends a descriptor's lease on its owner.
func (n *Node) release(ctx context.Context, d *tensor.Descriptor) error {
	if d.Owner == n.self.Name {
		if d.Incarnation != n.incarnation {
			return nil // that life's leases died with it
		}
		return n.store.Release(d.ExportID, d.Lease)
	}
	ps := n.peer(d.Owner)
	if ps == nil {
		return nil // the owner is down: its leases died with it
	}
	return ps.peer.Send(ctx, wire.FrameRelease, 0, 0, &wire.Release{ExportID: d.ExportID, Lease: d.Lease, Incarnation: d.Incarnation})
}
