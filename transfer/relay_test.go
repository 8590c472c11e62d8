package transfer

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// fanOut lends x to b in n messages (a Ref each, as n actors of b would
// get it) and returns the Refs b delivered.
func fanOut(t *testing.T, a, b *Engine, x *tensor.Tensor, n int) []tensor.Ref {
	t.Helper()
	refs := make([]tensor.Ref, n)
	for i := range refs {
		_, got, in, err := carry(t, a, b, &grad{Step: i, R: tensor.NewRef(x)})
		if err != nil || in != nil {
			t.Fatalf("message %d: in %v, %v", i, in, err)
		}
		refs[i] = got.R
	}
	return refs
}

// fetchAll fetches every Ref at once, each on its goroutine; cancel[i],
// when set, is the context of Ref i's fetch.
func fetchAll(refs []tensor.Ref, ctxs map[int]context.Context) ([]*tensor.Tensor, []error, *sync.WaitGroup) {
	got, errs := make([]*tensor.Tensor, len(refs)), make([]error, len(refs))
	var wg sync.WaitGroup
	for i, r := range refs {
		ctx := ctxs[i]
		if ctx == nil {
			ctx = context.Background()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = r.Fetch(ctx, memory.CPU)
		}()
	}
	return got, errs, &wg
}

const relayTestBytes = 1 << 16

func relayConfig(off bool) Config {
	return Config{InlineThreshold: 64, Flow: config.FlowConfig{NoRelay: off, RelayMinBytes: 1024}}
}

// TestRelayOneFetchPerContent: n receivers of one node fetching one lent
// tensor at once cost its owner one transfer; the others copy the first
// copy on the node; each gets its own correct tensor and every lease ends.
// With relay off, each fetches from the owner.
func TestRelayOneFetchPerContent(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "on", true: "off"}[off], func(t *testing.T) {
			const n = 4
			a, b, _, _ := enginePair(t, relayConfig(off))
			x := newTensor(t, relayTestBytes, 7)
			refs := fanOut(t, a, b, x, n)
			var content uint64
			for _, r := range refs {
				d := r.Descriptor()
				if content != 0 && d.Content != content {
					t.Fatalf("contents %d and %d of one tensor", content, d.Content)
				}
				content = d.Content
			}
			open := holdFetches(t)
			got, errs, wg := fetchAll(refs, nil)
			if !off {
				// Every follower joined the leader, which holds in the gate.
				waitFor(t, func() bool { return b.relayJoined(a.cfg.Node, 1, content) == n-1 })
			}
			open()
			wg.Wait()
			for i := range got {
				if errs[i] != nil || got[i].ByteSize() != relayTestBytes || got[i].Host()[relayTestBytes-1] != 7 {
					t.Fatalf("receiver %d: %v, %v", i, got[i], errs[i])
				}
				for j := range i {
					if &got[j].Host()[0] == &got[i].Host()[0] {
						t.Fatalf("receivers %d and %d share a buffer", j, i)
					}
				}
			}
			for _, g := range got {
				_ = g.Free()
			}
			waitFor(t, func() bool { return a.Store().Len() == 0 && x.Leases() == 0 })
			s := b.Stats()
			fromOwner, relayed := s.Channels["memtest"].Transfers, s.Channels[RelayChannel].Transfers
			want := [2]int64{1, n - 1}
			if off {
				want = [2]int64{n, 0}
			}
			if [2]int64{int64(fromOwner), int64(relayed)} != want {
				t.Fatalf("from the owner %d, relayed %d: want %v (%+v)", fromOwner, relayed, want, s.Channels)
			}
		})
	}
}

// TestRelayLeaderFails: a leader whose fetch fails costs its followers a
// fetch from the owner, not a hang or a failure; every lease ends.
func TestRelayLeaderFails(t *testing.T) {
	const n = 3
	a, b, _, _ := enginePair(t, relayConfig(false))
	x := newTensor(t, relayTestBytes, 9)
	refs := fanOut(t, a, b, x, n)
	d := refs[0].Descriptor()
	open := holdFetches(t)
	// Ref 0 fetches first and leads; then the others join.
	ctx, cancel := context.WithCancel(context.Background())
	got0, errs0, wg0 := fetchAll(refs[:1], map[int]context.Context{0: ctx})
	waitFor(t, func() bool { return b.relayJoined(a.cfg.Node, 1, d.Content) == 0 })
	got, errs, wg := fetchAll(refs[1:], nil)
	waitFor(t, func() bool { return b.relayJoined(a.cfg.Node, 1, d.Content) == n-1 })
	cancel() // the leader fails mid-way
	wg0.Wait()
	if !errors.Is(errs0[0], context.Canceled) || got0[0] != nil {
		t.Fatalf("leader: %v, %v", got0[0], errs0[0])
	}
	open()
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i].Host()[relayTestBytes-1] != 9 {
			t.Fatalf("follower %d: %v, %v", i, got[i], errs[i])
		}
		_ = got[i].Free()
	}
	waitFor(t, func() bool { return a.Store().Len() == 0 && x.Leases() == 0 })
	if s := b.Stats(); s.Channels["memtest"].Transfers != n-1 || s.Channels[RelayChannel].Transfers != 0 {
		t.Fatalf("stats %+v", s.Channels)
	}
}

// TestRelayMismatchedType: a descriptor that names a content in flight but
// not its type does not join it.
func TestRelayMismatchedType(t *testing.T) {
	a := &tensor.Descriptor{DType: tensor.Uint8, Shape: tensor.Shape{8}, Bytes: 8}
	for _, b := range []*tensor.Descriptor{
		{DType: tensor.Int8, Shape: tensor.Shape{8}, Bytes: 8},
		{DType: tensor.Uint8, Shape: tensor.Shape{2, 4}, Bytes: 8},
		{DType: tensor.Uint8, Shape: tensor.Shape{8}, Bytes: 9},
	} {
		if sameContent(a, b) {
			t.Fatalf("%v and %v taken for the same content", a, b)
		}
	}
	if !sameContent(a, &tensor.Descriptor{DType: tensor.Uint8, Shape: tensor.Shape{8}, Bytes: 8}) {
		t.Fatal("same type refused")
	}
}

// TestRelayMessagesOfOnePeer: messages of one peer lending one tensor,
// each to its own receiver, cost the owner one transfer: the first is not
// fetched alone on the delivery loop, so the next ones join its fetch.
func TestRelayMessagesOfOnePeer(t *testing.T) {
	const n = 3
	a, b, _, _ := enginePair(t, relayConfig(false))
	x := newTensor(t, relayTestBytes, 5)
	open := holdFetches(t)
	d := &delivery{ch: make(chan error, n)}
	var msgs []*grad
	var content uint64
	for i := range n {
		_, got, in, err := carry(t, a, b, &grad{Step: i, W: x})
		if err != nil || in == nil {
			t.Fatalf("message %d: in %v, %v", i, in, err)
		}
		content = in.jobs[0].d.Content
		if err := b.Enqueue(a.cfg.Node, in, 100, d); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, got)
		// The first is being fetched before the next arrives.
		waitFor(t, func() bool { return b.relayJoined(a.cfg.Node, 1, content) == i })
	}
	open()
	for i, m := range msgs {
		if err := <-d.ch; err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Step != i || m.W.Host()[relayTestBytes-1] != 5 {
			t.Fatalf("message %d: step %d, %v", i, m.Step, m.W)
		}
		_ = m.W.Free()
	}
	waitFor(t, func() bool { return a.Store().Len() == 0 && x.Leases() == 0 })
	if s := b.Stats(); s.Channels["memtest"].Transfers != 1 || s.Channels[RelayChannel].Transfers != n-1 {
		t.Fatalf("stats %+v", s.Channels)
	}
}

// TestRelayNotOnTheReader: a message that may relay is not fetched on the
// reader (Receive), which would hold up the peer's next messages; with
// relay off, the same message is.
func TestRelayNotOnTheReader(t *testing.T) {
	directFetches(t)
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "on", true: "off"}[off], func(t *testing.T) {
			a, b, _, _ := enginePair(t, relayConfig(off))
			x := newTensor(t, relayTestBytes, 3)
			_, got, in, err := carry(t, a, b, &grad{W: x})
			if err != nil {
				t.Fatal(err)
			}
			d := &delivery{ch: make(chan error, 1)}
			if err := b.Receive(a.cfg.Node, in, 100, d, nil); err != nil {
				t.Fatal(err)
			}
			if err := <-d.ch; err != nil || got.W.Host()[relayTestBytes-1] != 3 {
				t.Fatalf("delivered %v, %v", got.W, err)
			}
			_ = got.W.Free()
			waitFor(t, func() bool { return x.Leases() == 0 })
			if n, want := b.Stats().ReaderDeliveries, map[bool]int64{false: 0, true: 1}[off]; n != want {
				t.Fatalf("%d messages fetched on the reader, want %d", n, want)
			}
		})
	}
}
