package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/vmihailenco/msgpack/v5"
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
	askOp := func(op uint64, n int64, mod func(*tensor.Descriptor)) []byte {
		q := contentOf(d)
		mod(q)
		return encodeRelayAsk(relayAsk{op: op, n: n, d: q})
	}
	ask := func(mod func(*tensor.Descriptor)) []byte { return askOp(relayWhole, 0, mod) }
	same := func(*tensor.Descriptor) {}
	for name, req := range map[string][]byte{
		"garbage":             {0xc1, 0x00},
		"descriptor only":     ask(same)[2:],
		"trailing":            append(ask(same), 0),
		"other content":       ask(func(q *tensor.Descriptor) { q.Content++ }),
		"other shape":         ask(func(q *tensor.Descriptor) { q.Shape, q.Bytes = tensor.Shape{relayTestBytes / 2, 2}, relayTestBytes }),
		"no content":          ask(func(q *tensor.Descriptor) { q.Content = 0 }),
		"bad bytes":           ask(func(q *tensor.Descriptor) { q.Bytes++ }),
		"unknown op":          askOp(relayPush+1, 0, same),
		"whole with a count":  askOp(relayWhole, 1, same),
		"stream with a count": askOp(relayStream, 1, same),
		"progress to 0":       askOp(relayProgress, 0, same),
		"progress < 0":        askOp(relayProgress, -1, same),
		"progress past end":   askOp(relayProgress, relayTestBytes+1, same),
		"progress, other":     askOp(relayProgress, 1, func(q *tensor.Descriptor) { q.Content++ }),
		"progress, shape":     askOp(relayProgress, 1, func(q *tensor.Descriptor) { q.Shape, q.Bytes = tensor.Shape{relayTestBytes / 2, 2}, relayTestBytes }),
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

// relayLanded returns the bytes landed in the flight of content c of
// owner now in flight on e (-1: none in flight).
func (e *Engine) relayLanded(owner string, incarnation, c uint64) int64 {
	e.relays.mu.Lock()
	f := e.relays.m[relayKey{owner, incarnation, c}]
	e.relays.mu.Unlock()
	if f == nil {
		return -1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.landed
}

// TestRelayStreamPipelined: the head of a host fetches the content from
// the owner in pieces, and another receiver borrows the head's copy at
// once and copies each piece as soon as it landed there: it copies its
// first piece while the head has only that one. Everything arrives
// whole, over one loan of each copy; every loan ends.
func TestRelayStreamPipelined(t *testing.T) {
	const pieces = 4
	memtestInPieces(t, pieces)
	es := engineMesh(t, relayConfig(false), "h1", "h2", "h2")
	owner, head, other := es[0], es[1], es[2]
	x := newTensor(t, relayTestBytes, 0)
	for i := range x.Host() {
		x.Host()[i] = byte(i * 7)
	}
	refs := lendRefs(t, owner, []*Engine{head, other}, x)
	content := refs[0].Descriptor().Content
	open, pass := holdFetchesOneByOne(t)
	hch := fetchOn(refs[:1], context.Background())
	waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 0 })
	och := fetchOn(refs[1:], context.Background())
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 }) // the head's first piece
	pass()
	// The head holds one piece: it fetches its second, and the other
	// receiver its first, from the head.
	waitFor(t, func() bool {
		return head.relayLanded(owner.cfg.Node, 1, content) == relayTestBytes/pieces && memtestWaiting.Load() == 2
	})
	open()
	for _, ch := range []chan fetched{hch, och} {
		f := <-ch
		if f.err != nil {
			t.Fatal(f.err)
		}
		for i, b := range f.t.Host() {
			if b != byte(i*7) {
				t.Fatalf("byte %d is %d", i, b)
			}
		}
		_ = f.t.Free()
	}
	waitFor(t, func() bool {
		return owner.Store().Len() == 0 && x.Leases() == 0 && head.Store().Len() == 0 && other.Store().Len() == 0
	})
	if s := other.Stats(); s.RelayFetched != 1 || s.RelayFallbacks != 0 || s.ByPeer[head.cfg.Node]["memtest"].Transfers != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 0 {
		t.Fatalf("other: relayed %d, fell back %d, %+v", s.RelayFetched, s.RelayFallbacks, s.ByPeer)
	}
	if s := head.Stats(); s.RelayServed != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
		t.Fatalf("head: served %d, %+v", s.RelayServed, s.ByPeer)
	}
}

// TestRelayStreamHolderFails: a receiver following a holder whose own
// fetch fails half-way gets the error from its progress request and
// fetches from the owner; everything arrives whole and every loan ends.
func TestRelayStreamHolderFails(t *testing.T) {
	const pieces = 4
	memtestInPieces(t, pieces)
	es := engineMesh(t, relayConfig(false), "h1", "h2", "h2")
	owner, head, other := es[0], es[1], es[2]
	x := newTensor(t, relayTestBytes, 5)
	refs := lendRefs(t, owner, []*Engine{head, other}, x)
	content := refs[0].Descriptor().Content
	open, pass := holdFetchesOneByOne(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hch := fetchOn(refs[:1], ctx)
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 })
	pass()
	waitFor(t, func() bool {
		return head.relayLanded(owner.cfg.Node, 1, content) == relayTestBytes/pieces && memtestWaiting.Load() == 1
	})
	och := fetchOn(refs[1:], context.Background())
	// The other borrowed the head's copy and waits to copy the piece the
	// head holds; the head's fetch of its second piece fails.
	waitFor(t, func() bool { return memtestWaiting.Load() == 2 })
	cancel()
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 })
	pass()
	open()
	if f := <-hch; f.err == nil {
		t.Fatal("the head's fetch did not fail")
	}
	f := <-och
	if f.err != nil {
		t.Fatal(f.err)
	}
	for i, b := range f.t.Host() {
		if b != 5 {
			t.Fatalf("byte %d is %d", i, b)
		}
	}
	_ = f.t.Free()
	_ = refs[0].Release(context.Background())
	waitFor(t, func() bool { return owner.Store().Len() == 0 && x.Leases() == 0 && head.Store().Len() == 0 })
	if s := other.Stats(); s.RelayFetched != 0 || s.RelayFallbacks != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
		t.Fatalf("other: relayed %d, fell back %d, %+v", s.RelayFetched, s.RelayFallbacks, s.ByPeer)
	}
}

// TestRelayStreamFollowers: receivers of one node copy the first fetch's
// pieces as they land; each gets the whole tensor, in one fetch from the
// owner, and every lease ends. With relay_stream off they wait for the
// whole, with the same result.
func TestRelayStreamFollowers(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			const n = 3
			memtestInPieces(t, 4)
			cfg := relayConfig(false)
			cfg.Flow.NoRelayStream = !stream
			a, b, _, _ := enginePair(t, cfg)
			x := newTensor(t, relayTestBytes, 6)
			refs := fanOut(t, a, b, x, n)
			open := holdFetches(t)
			got, errs, wg := fetchAll(refs, nil)
			waitFor(t, func() bool { return b.relayJoined(a.cfg.Node, 1, refs[0].Descriptor().Content) == n-1 })
			open()
			wg.Wait()
			for i := range got {
				if errs[i] != nil || got[i].Host()[relayTestBytes-1] != 6 || got[i].Host()[0] != 6 {
					t.Fatalf("receiver %d: %v, %v", i, got[i], errs[i])
				}
				_ = got[i].Free()
			}
			waitFor(t, func() bool { return a.Store().Len() == 0 && x.Leases() == 0 })
			if s := b.Stats(); s.Channels["memtest"].Bytes != relayTestBytes {
				t.Fatalf("%d bytes from the owner, want one copy: %+v", s.Channels["memtest"].Bytes, s.Channels)
			}
		})
	}
}

// FuzzRelayAsk: the relay request decoder never panics, and what it
// accepts encodes back to a request that decodes the same.
func FuzzRelayAsk(f *testing.F) {
	d := &tensor.Descriptor{Owner: "a", Incarnation: 1, DType: tensor.Uint8, Shape: tensor.Shape{1 << 20}, Bytes: 1 << 20, Device: "cpu", Content: 3}
	rd := &tensor.Descriptor{Owner: "b", Incarnation: 2, Holder: "c", ExportID: 4, Lease: 5, DType: tensor.Float32, Shape: tensor.Shape{1 << 18},
		Bytes: 1 << 20, Device: "cuda:1", Offers: map[string][]byte{"ipc": {1, 2, 3}}}
	for _, a := range []relayAsk{{d: d}, {op: relayStream, d: d}, {op: relayProgress, n: 1 << 18, d: d}, {op: relayPush, d: d, rd: rd}} {
		f.Add(encodeRelayAsk(a))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := decodeRelayAsk(in)
		if err != nil {
			return
		}
		again, err := decodeRelayAsk(encodeRelayAsk(a))
		if err != nil || again.op != a.op || again.n != a.n || again.d.String() != a.d.String() || again.d.Content != a.d.Content {
			t.Fatalf("%x: %+v, then %+v, %v", in, a, again, err)
		}
		if (a.op == relayPush) != (a.rd != nil) {
			t.Fatalf("%x: operation %d with destination %v", in, a.op, a.rd)
		}
		if a.rd != nil && (again.rd == nil || again.rd.String() != a.rd.String() || again.rd.ExportID != a.rd.ExportID ||
			again.rd.Lease != a.rd.Lease || again.rd.Holder != a.rd.Holder || a.rd.Bytes != a.d.Bytes) {
			t.Fatalf("%x: destination %+v, then %+v", in, a.rd, again.rd)
		}
	})
}

// TestRelayExpected: a relay request that reaches the named receiver
// after it received its message but before that message's fetch started
// waits for the fetch, however short relayGrace is, instead of sending
// the asker back to the owner.
func TestRelayExpected(t *testing.T) {
	t.Cleanup(SetRelayGrace(time.Nanosecond))
	es := engineMesh(t, relayConfig(false), "h1", "h2", "h2")
	owner, head, other := es[0], es[1], es[2]
	x := newTensor(t, relayTestBytes, 8)
	open := holdFetches(t)
	_, hmsg, hin, err := carry(t, owner, head, &grad{W: x})
	if err != nil {
		t.Fatal(err)
	}
	_, omsg, oin, err := carry(t, owner, other, &grad{W: x})
	if err != nil || oin.jobs[0].d.Relay != head.cfg.Node {
		t.Fatalf("%v, relay %q", err, oin.jobs[0].d.Relay)
	}
	content := oin.jobs[0].d.Content
	od := &delivery{ch: make(chan error, 1)}
	if err := other.Enqueue(owner.cfg.Node, oin, 100, od); err != nil {
		t.Fatal(err)
	}
	// The other's ask waits on the head, which has its message but has
	// not started fetching it.
	waitFor(t, func() bool {
		head.relays.mu.Lock()
		defer head.relays.mu.Unlock()
		return head.relays.started != nil
	})
	hd := &delivery{ch: make(chan error, 1)}
	if err := head.Enqueue(owner.cfg.Node, hin, 100, hd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 1 })
	open()
	for _, c := range []struct {
		d *delivery
		m *grad
	}{{hd, hmsg}, {od, omsg}} {
		if err := <-c.d.ch; err != nil || c.m.W.Host()[relayTestBytes-1] != 8 {
			t.Fatalf("%v, %v", c.m.W, err)
		}
		_ = c.m.W.Free()
	}
	waitFor(t, func() bool { return owner.Store().Len() == 0 && x.Leases() == 0 && head.Store().Len() == 0 })
	if s := other.Stats(); s.RelayFetched != 1 || s.RelayFallbacks != 0 {
		t.Fatalf("relayed %d, fell back %d", s.RelayFetched, s.RelayFallbacks)
	}
	head.relays.mu.Lock()
	left := len(head.relays.expected)
	head.relays.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d contents still expected", left)
	}
}

// TestRelayExpectedRefused: a message refused at import (over the budget
// here) announces no flight afterwards, whatever it lent.
func TestRelayExpectedRefused(t *testing.T) {
	cfg := relayConfig(false)
	cfg.Flow.ReceiveBudget, cfg.Flow.ReceiveBudgetPerPeer = 1<<30, relayTestBytes
	es := engineMesh(t, cfg, "h1", "h2")
	owner, head := es[0], es[1]
	x, y := newTensor(t, relayTestBytes, 1), newTensor(t, relayTestBytes, 2)
	type two struct{ A, B *tensor.Tensor }
	out, err := owner.Export(head.cfg.Node, &two{x, y})
	if err != nil {
		t.Fatal(err)
	}
	var got two
	body, _ := msgpack.Marshal(&two{x, y})
	_ = msgpack.Unmarshal(body, &got)
	if in, err := head.Import(owner.cfg.Node, out.Table, &got, memory.CPU); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("%v, %v", in, err)
	}
	head.relays.mu.Lock()
	left := len(head.relays.expected)
	head.relays.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d contents still expected after the refusal", left)
	}
	out.Abort()
}
