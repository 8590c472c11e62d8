package rdmatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/vmihailenco/msgpack/v5"
)

// Node names and settings used by the pairs.
const (
	OwnerNode   = "owner"
	FetcherNode = "fetcher"
	// TestChunkSize is the chunk size the pairs give their channels: small
	// enough that the suite's sizes cross many chunk boundaries.
	TestChunkSize = 1 << 20
	// TestChunksInFlight is the window the pairs give their channels.
	TestChunksInFlight = 4
)

// The config sections the pairs give their channels (through rdma.Env):
// chunks of TestChunkSize, TestChunksInFlight of them in flight.
var (
	TestStaging = config.StagingConfig{ChunkSize: TestChunkSize, ChunksInFlight: TestChunksInFlight}
	TestVerbs   = config.VerbsConfig{ChunkSize: TestChunkSize, Window: TestChunksInFlight}
)

// inFlighter is implemented by channels that count their transfers.
type inFlighter interface{ InFlight() int }

// owner is the owner end of an in-process pair.
type owner struct {
	dev   memory.Device
	ch    rdma.Channel
	store *tensor.Store
	peer  string

	mu      sync.Mutex
	exports []*exported
}

type exported struct {
	d *tensor.Descriptor
	t *tensor.Tensor
}

// export makes a tensor holding Fill(seed)[:size] on the owner's device and
// exports it to the peer, with the channel's offer.
func (o *owner) export(seed uint64, size int) (*tensor.Descriptor, error) {
	ctx := context.Background()
	host, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(size)})
	if err != nil {
		return nil, err
	}
	Fill(seed, host.Host())
	t := host
	if o.dev != memory.CPU {
		t, err = host.To(ctx, o.dev)
		_ = host.Free()
		if err != nil {
			return nil, err
		}
	}
	e, d, err := o.store.Export(t, o.peer, 0)
	if err != nil {
		_ = t.Free()
		return nil, err
	}
	o.mu.Lock()
	o.exports = append(o.exports, &exported{d: d, t: t})
	o.mu.Unlock()
	offer, err := o.ch.Offer(ctx, e, o.peer)
	if err != nil {
		return nil, fmt.Errorf("offer: %w", err)
	}
	if offer != nil {
		d.Offers = map[string][]byte{o.ch.Name(): offer}
	}
	// The descriptor crosses the wire as msgpack: make sure it survives.
	b, err := msgpack.Marshal(d)
	if err != nil {
		return nil, err
	}
	out := new(tensor.Descriptor)
	if err := msgpack.Unmarshal(b, out); err != nil {
		return nil, err
	}
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

func (o *owner) release(d *tensor.Descriptor) error { return o.store.Release(d.ExportID, d.Lease) }

// check reports an export whose lease ended while its tensor is still lent
// (an acquisition left behind), or a transfer still in flight.
func (o *owner) check() error {
	if f, ok := o.ch.(inFlighter); ok {
		if n := f.InFlight(); n != 0 {
			return fmt.Errorf("%d transfers in flight on the owner's channel", n)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, x := range o.exports {
		want := 0
		if _, done, err := o.store.Acquire(x.d.Incarnation, x.d.ExportID, x.d.Lease); err == nil {
			done()
			want = 1
		}
		if got := x.t.Leases(); got != want {
			return fmt.Errorf("export %d: tensor has %d leases, want %d (acquisition not released)", x.d.ExportID, got, want)
		}
	}
	return nil
}

// close ends every lease and frees the tensors once the channel has let go.
func (o *owner) close(t testing.TB) {
	o.store.Close()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, x := range o.exports {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := x.t.WaitReleased(ctx)
		cancel()
		if err != nil {
			t.Errorf("export %d still lent after the store closed: %v", x.d.ExportID, err)
			continue
		}
		if err := x.t.Free(); err != nil {
			t.Errorf("freeing export %d: %v", x.d.ExportID, err)
		}
	}
	o.exports = nil
}

// InProcessPair builds an owner node and a fetcher node in this process,
// each with its own Env, Store and channel from newChannel, joined by TCP
// loopback: the fetcher's Env.Dial connects to a listener whose connections
// go to the owner channel's ServeConn, and Env.Control calls the other
// side's HandleControl directly. Kill closes the owner's channel and its
// listener. Everything is closed in t.Cleanup, and an export still lent
// after the owner closed fails the test.
func InProcessPair(t testing.TB, newChannel func(env *rdma.Env) (rdma.Channel, error), ownerDev, fetchDev memory.Device) *Pair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		ownerCh, fetchCh rdma.Channel
		chMu             sync.Mutex
	)
	control := func(target *rdma.Channel, from string) func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
		return func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
			chMu.Lock()
			ch := *target
			chMu.Unlock()
			h, ok := ch.(rdma.ControlHandler)
			if !ok || ch.Name() != channel {
				return nil, fmt.Errorf("rdmatest: %s has no control handler for %q", node, channel)
			}
			return h.HandleControl(ctx, from, req)
		}
	}
	ownerEnv := &rdma.Env{
		Node: OwnerNode, Incarnation: 1, Store: tensor.NewStore(OwnerNode, 1),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("rdmatest: the owner does not dial")
		},
		Control: control(&fetchCh, OwnerNode),
		Staging: TestStaging, Verbs: TestVerbs,
	}
	addr := ln.Addr().String()
	fetchEnv := &rdma.Env{
		Node: FetcherNode, Incarnation: 1, Store: tensor.NewStore(FetcherNode, 1),
		Dial: func(ctx context.Context, node, channel string) (net.Conn, error) {
			if node != OwnerNode {
				return nil, fmt.Errorf("rdmatest: no node %q", node)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		Control: control(&ownerCh, FetcherNode),
		Staging: TestStaging, Verbs: TestVerbs,
	}
	oc, err := newChannel(ownerEnv)
	if err != nil {
		_ = ln.Close()
		t.Fatalf("owner channel: %v", err)
	}
	fc, err := newChannel(fetchEnv)
	if err != nil {
		_ = oc.Close()
		_ = ln.Close()
		t.Fatalf("fetcher channel: %v", err)
	}
	chMu.Lock()
	ownerCh, fetchCh = oc, fc
	chMu.Unlock()
	o := &owner{dev: ownerDev, ch: oc, store: ownerEnv.Store, peer: FetcherNode}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			cs, ok := oc.(rdma.ConnServer)
			if !ok {
				_ = conn.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cs.ServeConn(conn, FetcherNode)
			}()
		}
	}()
	var killOnce sync.Once
	kill := func() {
		killOnce.Do(func() {
			_ = ln.Close()
			_ = oc.Close()
		})
	}
	t.Cleanup(func() {
		if err := fc.Close(); err != nil {
			t.Errorf("closing the fetcher channel: %v", err)
		}
		kill()
		wg.Wait()
		o.close(t)
		fetchEnv.Store.Close()
	})
	return &Pair{
		Fetcher:     fc,
		FetchDevice: fetchDev,
		OwnerDevice: ownerDev,
		ChunkSize:   TestChunkSize,
		Export: func(t testing.TB, seed uint64, size int) *tensor.Descriptor {
			t.Helper()
			d, err := o.export(seed, size)
			if err != nil {
				t.Fatalf("export of %d bytes: %v", size, err)
			}
			return d
		},
		Release: func(_ testing.TB, d *tensor.Descriptor) error { return o.release(d) },
		Kill:    kill,
		Check:   o.check,
	}
}

// SameNodePair builds one node whose channel is both owner and fetcher, for
// channels that move bytes within a process (local). It has no Kill.
func SameNodePair(t testing.TB, newChannel func(env *rdma.Env) (rdma.Channel, error), ownerDev, fetchDev memory.Device) *Pair {
	t.Helper()
	const node = "node"
	env := &rdma.Env{
		Node: node, Incarnation: 1, Store: tensor.NewStore(node, 1),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("rdmatest: a single node does not dial")
		},
		Control: func(context.Context, string, string, []byte) ([]byte, error) {
			return nil, errors.New("rdmatest: a single node has no control plane")
		},
		Staging: TestStaging, Verbs: TestVerbs,
	}
	ch, err := newChannel(env)
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	o := &owner{dev: ownerDev, ch: ch, store: env.Store, peer: node}
	t.Cleanup(func() {
		if err := ch.Close(); err != nil {
			t.Errorf("closing the channel: %v", err)
		}
		o.close(t)
	})
	return &Pair{
		Fetcher:     ch,
		FetchDevice: fetchDev,
		OwnerDevice: ownerDev,
		ChunkSize:   TestChunkSize,
		Export: func(t testing.TB, seed uint64, size int) *tensor.Descriptor {
			t.Helper()
			d, err := o.export(seed, size)
			if err != nil {
				t.Fatalf("export of %d bytes: %v", size, err)
			}
			return d
		},
		Release: func(_ testing.TB, d *tensor.Descriptor) error { return o.release(d) },
		Check:   o.check,
	}
}
