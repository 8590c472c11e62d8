package transfer

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// engineMesh starts one engine per host in hosts (named after the test
// and their index, with that HostID), each up for every other.
func engineMesh(t *testing.T, cfg Config, hosts ...string) []*Engine {
	t.Helper()
	es := make([]*Engine, len(hosts))
	for i, h := range hosts {
		c := cfg
		c.Node, c.Incarnation, c.HostID = t.Name()+"-"+string(rune('a'+i)), uint64(i+1), h
		c.Disabled = func(ch string) bool { return ch != "memtest" }
		c.Dial = func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no data connections here")
		}
		es[i] = New(c)
		if err := es[i].Start(); err != nil {
			t.Fatal(err)
		}
		testEnginesMu.Lock()
		testEngines[c.Node] = es[i]
		testEnginesMu.Unlock()
	}
	for i, a := range es {
		for j, b := range es {
			if i == j {
				continue
			}
			adv, _ := b.Advert()
			if _, err := a.PeerUp(b.cfg.Node, b.cfg.Incarnation, adv, &link{from: a.cfg.Node, to: b}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, e := range es {
			e.Close()
			testEnginesMu.Lock()
			delete(testEngines, e.cfg.Node)
			testEnginesMu.Unlock()
		}
	})
	return es
}

// lendRefs lends x from owner to each receiver in one message (a Ref) and
// returns the Refs they got.
func lendRefs(t *testing.T, owner *Engine, receivers []*Engine, x *tensor.Tensor) []tensor.Ref {
	t.Helper()
	refs := make([]tensor.Ref, len(receivers))
	for i, r := range receivers {
		_, got, in, err := carry(t, owner, r, &grad{Step: i, R: tensor.NewRef(x)})
		if err != nil || in != nil {
			t.Fatalf("receiver %d: in %v, %v", i, in, err)
		}
		refs[i] = got.R
	}
	return refs
}

// fetchOn fetches each Ref on its goroutine; the results come on the
// returned channel, in any order.
func fetchOn(refs []tensor.Ref, ctx context.Context) chan fetched {
	ch := make(chan fetched, len(refs))
	for i, r := range refs {
		go func() {
			t, err := r.Fetch(ctx, memory.CPU)
			ch <- fetched{i, t, err}
		}()
	}
	return ch
}

type fetched struct {
	i   int
	t   *tensor.Tensor
	err error
}

// TestRelayAcrossHosts: one tensor lent to three receivers of another
// host crosses between the hosts once: the owner's plan names the first
// receiver of that host in the others' descriptors, they fetch from its
// copy, and every lease, the owner's and the relay's, ends.
func TestRelayAcrossHosts(t *testing.T) {
	es := engineMesh(t, relayConfig(false), "h1", "h2", "h2", "h2")
	owner, recv := es[0], es[1:]
	x := newTensor(t, relayTestBytes, 11)
	refs := lendRefs(t, owner, recv, x)
	for i, r := range refs {
		want := map[bool]string{true: "", false: recv[0].cfg.Node}[i == 0]
		if d := r.Descriptor(); d.Relay != want {
			t.Fatalf("receiver %d told to fetch from %q, want %q", i, d.Relay, want)
		}
	}
	content := refs[0].Descriptor().Content
	open := holdFetches(t)
	ch := fetchOn(refs[:1], context.Background())
	waitFor(t, func() bool { return recv[0].relayJoined(owner.cfg.Node, 1, content) == 0 })
	och := fetchOn(refs[1:], context.Background())
	// Both others wait on the head's fetch, which the gate holds.
	waitFor(t, func() bool { return recv[0].relayJoined(owner.cfg.Node, 1, content) == 2 })
	open()
	for i := range refs {
		var f fetched
		if i == 0 {
			f = <-ch
		} else {
			f = <-och
		}
		if f.err != nil || f.t.Host()[relayTestBytes-1] != 11 {
			t.Fatalf("receiver %d: %v, %v", f.i, f.t, f.err)
		}
		_ = f.t.Free()
	}
	waitFor(t, func() bool {
		return owner.Store().Len() == 0 && x.Leases() == 0 && recv[0].Store().Len() == 0
	})
	if s := recv[0].Stats(); s.RelayServed != 2 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
		t.Fatalf("head: served %d, from the owner %+v", s.RelayServed, s.ByPeer)
	}
	for _, r := range recv[1:] {
		s := r.Stats()
		if s.RelayFetched != 1 || s.RelayFallbacks != 0 || s.ByPeer[recv[0].cfg.Node]["memtest"].Transfers != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 0 {
			t.Fatalf("%s: relayed %d, fell back %d, %+v", r.cfg.Node, s.RelayFetched, s.RelayFallbacks, s.ByPeer)
		}
	}
}

// TestRelayPlanSameHost: on the owner's host, the owner serves up to
// RelayFanout receivers itself; past them, receivers fetch from earlier
// ones; a second message to a node is not planned again.
func TestRelayPlanSameHost(t *testing.T) {
	cfg := relayConfig(false)
	cfg.Flow.RelayFanout = 2
	es := engineMesh(t, cfg, "h", "h", "h", "h", "h")
	owner, recv := es[0], es[1:]
	x := newTensor(t, relayTestBytes, 1)
	refs := lendRefs(t, owner, append(recv, recv[0]), x)
	want := []string{"", "", recv[0].cfg.Node, recv[0].cfg.Node, ""}
	for i, r := range refs {
		if d := r.Descriptor(); d.Relay != want[i] {
			t.Fatalf("receiver %d told %q, want %q", i, d.Relay, want[i])
		}
	}
	for _, r := range refs {
		_ = r.Release(context.Background())
	}
	waitFor(t, func() bool { return owner.Store().Len() == 0 && x.Leases() == 0 })
	owner.relays.mu.Lock()
	left := len(owner.relays.lent) + len(owner.relays.byExport)
	owner.relays.mu.Unlock()
	if left != 0 {
		t.Fatalf("the owner's plan keeps %d entries after every lease ended", left)
	}
}

// TestRelayHolderCannotServe: a receiver told to fetch from another that
// does not hold the content (it never fetched it, or its fetch failed)
// fetches from the owner instead, and gets its copy.
func TestRelayHolderCannotServe(t *testing.T) {
	for _, how := range []string{"not fetched", "failed", "down"} {
		t.Run(how, func(t *testing.T) {
			es := engineMesh(t, relayConfig(false), "h1", "h2", "h2")
			owner, head, other := es[0], es[1], es[2]
			x := newTensor(t, relayTestBytes, 4)
			refs := lendRefs(t, owner, []*Engine{head, other}, x)
			if refs[1].Descriptor().Relay != head.cfg.Node {
				t.Fatal("no relay planned")
			}
			content := refs[0].Descriptor().Content
			switch how {
			case "failed":
				open := holdFetches(t)
				ctx, cancel := context.WithCancel(context.Background())
				hch := fetchOn(refs[:1], ctx)
				waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 0 })
				och := fetchOn(refs[1:], context.Background())
				waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 1 })
				cancel() // the head's fetch fails mid-way
				if f := <-hch; !errors.Is(f.err, context.Canceled) {
					t.Fatalf("head: %v", f.err)
				}
				open()
				f := <-och
				if f.err != nil || f.t.Host()[relayTestBytes-1] != 4 {
					t.Fatalf("other: %v, %v", f.t, f.err)
				}
				_ = f.t.Free()
			case "down":
				other.PeerDown(head.cfg.Node)
				fallthrough
			default:
				f := <-fetchOn(refs[1:], context.Background())
				if f.err != nil || f.t.Host()[relayTestBytes-1] != 4 {
					t.Fatalf("other: %v, %v", f.t, f.err)
				}
				_ = f.t.Free()
				_ = refs[0].Release(context.Background())
			}
			waitFor(t, func() bool { return owner.Store().Len() == 0 && x.Leases() == 0 && head.Store().Len() == 0 })
			if s := other.Stats(); s.RelayFetched != 0 || s.RelayFallbacks != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
				t.Fatalf("relayed %d, fell back %d, %+v", s.RelayFetched, s.RelayFallbacks, s.ByPeer)
			}
		})
	}
}

// TestRelayBadRequests: a relay request that is not a descriptor, or
// names a content the node does not hold or another type than it holds,
// gets an error and lends nothing.
func TestRelayBadRequests(t *testing.T) {
	es := engineMesh(t, relayConfig(false), "h1", "h2")
	owner, head := es[0], es[1]
	x := newTensor(t, relayTestBytes, 2)
	refs := lendRefs(t, owner, []*Engine{head}, x)
	open := holdFetches(t)
	ch := fetchOn(refs, context.Background())
	d := refs[0].Descriptor()
	waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, d.Content) == 0 })
	ask := func(mod func(*tensor.Descriptor)) []byte {
		q := tensor.Descriptor{Owner: d.Owner, Incarnation: d.Incarnation, DType: d.DType, Shape: d.Shape, Bytes: d.Bytes, Device: d.Device, Content: d.Content}
		mod(&q)
		b, _ := q.MarshalMsg(nil)
		return b
	}
	for name, req := range map[string][]byte{
		"garbage":       {0xc1, 0x00},
		"trailing":      append(ask(func(*tensor.Descriptor) {}), 0),
		"other content": ask(func(q *tensor.Descriptor) { q.Content++ }),
		"other shape":   ask(func(q *tensor.Descriptor) { q.Shape, q.Bytes = tensor.Shape{relayTestBytes / 2, 2}, relayTestBytes }),
		"no content":    ask(func(q *tensor.Descriptor) { q.Content = 0 }),
		"bad bytes":     ask(func(q *tensor.Descriptor) { q.Bytes++ }),
	} {
		if b, err := head.serveRelay(context.Background(), owner.cfg.Node, req); err == nil {
			t.Fatalf("%s: answered %x", name, b)
		}
	}
	if n := head.relayJoined(owner.cfg.Node, 1, d.Content); n != 0 {
		t.Fatalf("%d requests joined", n)
	}
	open()
	f := <-ch
	if f.err != nil {
		t.Fatal(f.err)
	}
	_ = f.t.Free()
	waitFor(t, func() bool { return owner.Store().Len() == 0 && head.Store().Len() == 0 })
}
