package ipc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

const (
	ownerNode   = "owner"
	fetcherNode = "fetcher"
)

// fakePair is an owner and a fetcher channel built without a CUDA driver
// (newChannel), whose Env.Control calls the other's HandleControl. tamper,
// when set, may rewrite every request and reply on the way.
type fakePair struct {
	owner, fetcher *Channel
	ownerStore     *tensor.Store

	mu     sync.Mutex
	tamper func(from string, req []byte) []byte
	lose   func(op uint8) bool // true: deliver the request, lose the reply
	calls  map[uint8]int       // requests by op
}

func newFakePair(t *testing.T, cfg Config) *fakePair {
	t.Helper()
	p := &fakePair{calls: map[uint8]int{}}
	route := func(from string, to **Channel) func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
		return func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
			if channel != rdma.IPC {
				return nil, fmt.Errorf("no channel %q", channel)
			}
			p.mu.Lock()
			tamper, lose := p.tamper, p.lose
			var op uint8
			if r, err := decodeRequest(req); err == nil {
				op = r.Op
				p.calls[op]++
			}
			p.mu.Unlock()
			if tamper != nil {
				req = tamper(from, req)
			}
			rep, err := (*to).HandleControl(ctx, from, req)
			if lose != nil && lose(op) {
				return nil, errors.New("connection lost")
			}
			return rep, err
		}
	}
	p.ownerStore = tensor.NewStore(ownerNode, 1)
	fetchStore := tensor.NewStore(fetcherNode, 1)
	var err error
	p.owner, err = newChannel(&rdma.Env{Node: ownerNode, Incarnation: 1, Store: p.ownerStore, Control: route(ownerNode, &p.fetcher)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.fetcher, err = newChannel(&rdma.Env{Node: fetcherNode, Incarnation: 1, Store: fetchStore, Control: route(fetcherNode, &p.owner)}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.fetcher.Close(); err != nil {
			t.Errorf("closing the fetcher: %v", err)
		}
		if err := p.owner.Close(); err != nil {
			t.Errorf("closing the owner: %v", err)
		}
		p.ownerStore.Close()
		fetchStore.Close()
	})
	return p
}

func (p *fakePair) count(op uint8) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}

// fakeCUDA wraps a made-up device range: enough for every step that does
// not reach the driver.
func fakeCUDA(t testing.TB, base uintptr, n int) memory.Buffer {
	t.Helper()
	b, err := memory.WrapCUDA(memory.CUDA(0), base, n, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// export lends a uint8 tensor over buf to holder and returns its
// descriptor with the owner's offer.
func (p *fakePair) export(t testing.TB, buf memory.Buffer, holder string) *tensor.Descriptor {
	t.Helper()
	tt, err := tensor.FromBuffer(buf, tensor.Uint8, tensor.Shape{int64(buf.Len())})
	if err != nil {
		t.Fatal(err)
	}
	e, d, err := p.ownerStore.Export(tt, holder, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, err := p.owner.Offer(context.Background(), e, holder)
	if err != nil {
		t.Fatal(err)
	}
	if o != nil {
		d.Offers = map[string][]byte{rdma.IPC: o}
	}
	return d
}
