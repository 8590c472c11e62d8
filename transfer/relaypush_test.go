package transfer

import (
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// pushConfig is relayConfig with Flow.NoRelayPush off.
func pushConfig() Config {
	cfg := relayConfig(false)
	cfg.Flow.NoRelayPush = false
	return cfg
}

// pushMesh starts an owner on one host and n receivers on another (the
// first, the head, fetches from the owner; the owner names it to the
// others), and makes the others see the head's GPU as the one their
// destinations (host memory here) lie on, so that they have it push.
func pushMesh(t *testing.T, cfg Config, n int) (owner, head *Engine, others []*Engine) {
	t.Helper()
	hosts := []string{"h1"}
	for range n {
		hosts = append(hosts, "h2")
	}
	es := engineMesh(t, cfg, hosts...)
	owner, head, others = es[0], es[1], es[2:]
	for _, r := range others {
		r.caps.Devices = []rdma.DeviceInfo{{Device: "cpu", UUID: "GPU-1"}}
		r.peer(head.cfg.Node).caps.Devices = []rdma.DeviceInfo{{Device: "cuda:0", UUID: "GPU-1"}}
	}
	return owner, head, others
}

// allIdle reports whether no store of es lends anything any more.
func allIdle(es ...*Engine) bool {
	for _, e := range es {
		if e.Store().Len() != 0 {
			return false
		}
	}
	return true
}

// TestRelayPushOnMyGPU: a receiver has the receiver the owner named push
// only when that is another node on its destination's GPU, with
// relay_push and relay_stream on.
func TestRelayPushOnMyGPU(t *testing.T) {
	es := engineMesh(t, pushConfig(), "h", "h", "h")
	me, same, other := es[0], es[1], es[2]
	dst := newTensor(t, 8, 0)
	me.caps.Devices = []rdma.DeviceInfo{{Device: dst.Device().String(), UUID: "GPU-1"}}
	me.peer(same.cfg.Node).caps.Devices = []rdma.DeviceInfo{{Device: "cuda:0", UUID: "GPU-1"}}
	me.peer(other.cfg.Node).caps.Devices = []rdma.DeviceInfo{{Device: "cuda:0", UUID: "GPU-2"}}
	for from, want := range map[string]bool{same.cfg.Node: true, other.cfg.Node: false, "": false, me.cfg.Node: false, "gone": false} {
		if got := me.mayPush(from, dst); got != want {
			t.Fatalf("holder %q: %v, want %v", from, got, want)
		}
	}
	me.cfg.Flow.NoRelayStream = true
	if me.mayPush(same.cfg.Node, dst) {
		t.Fatal("pushes with relay_stream off")
	}
	me.cfg.Flow.NoRelayStream, me.cfg.Flow.NoRelayPush = false, true
	if me.mayPush(same.cfg.Node, dst) {
		t.Fatal("pushes with relay_push off")
	}
}

// TestRelayPush: the head of a host fetches the content from the owner
// in pieces, and writes each piece into the destinations of the other
// receivers on its GPU as soon as it landed (their first piece while it
// holds only that one). Every receiver gets the right bytes, the owner
// serves one fetch, and every loan (the owner's, the receivers'
// destinations) ends.
func TestRelayPush(t *testing.T) {
	const pieces = 4
	memtestInPieces(t, pieces)
	memtestPuts.Store(0)
	owner, head, others := pushMesh(t, pushConfig(), 3)
	x := newTensor(t, relayTestBytes, 0)
	for i := range x.Host() {
		x.Host()[i] = byte(i * 7)
	}
	refs := lendRefs(t, owner, append([]*Engine{head}, others...), x)
	content := refs[0].Descriptor().Content
	for _, r := range refs[1:] {
		if r.Descriptor().Relay != head.cfg.Node {
			t.Fatalf("relay %q, want the head", r.Descriptor().Relay)
		}
	}
	open, pass := holdFetchesOneByOne(t)
	hch := fetchOn(refs[:1], context.Background())
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 }) // the head's first piece
	pass()
	waitFor(t, func() bool { return head.relayLanded(owner.cfg.Node, 1, content) == relayTestBytes/pieces })
	och := fetchOn(refs[1:], context.Background())
	// The head's second piece, and its put of the first into each
	// other's destination, wait at the gate.
	waitFor(t, func() bool { return memtestWaiting.Load() == 3 })
	open()
	for i, ch := range []chan fetched{hch, och, och} {
		f := <-ch
		if f.err != nil {
			t.Fatalf("fetch %d: %v", i, f.err)
		}
		for i, b := range f.t.Host() {
			if b != byte(i*7) {
				t.Fatalf("byte %d is %d", i, b)
			}
		}
		_ = f.t.Free()
	}
	waitFor(t, func() bool { return allIdle(append([]*Engine{owner, head}, others...)...) && x.Leases() == 0 })
	if n := memtestPuts.Load(); n != 2*pieces {
		t.Fatalf("%d pieces put, want %d", n, 2*pieces)
	}
	if s := head.Stats(); s.RelayServed != 2 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
		t.Fatalf("head: served %d, %+v", s.RelayServed, s.ByPeer)
	}
	for _, r := range others {
		s := r.Stats()
		if s.RelayFetched != 1 || s.RelayPushed != 1 || s.RelayFallbacks != 0 || len(s.ByPeer[owner.cfg.Node]) != 0 ||
			s.ByPeer[head.cfg.Node][RelayPushChannel].Bytes != relayTestBytes {
			t.Fatalf("%s: relayed %d, pushed %d, fell back %d, %+v", r.cfg.Node, s.RelayFetched, s.RelayPushed, s.RelayFallbacks, s.ByPeer)
		}
	}
}

// TestRelayPushRefused: a head that cannot push (its channel does not
// write, or it does not hold the content) costs the receiver its push
// only: it fetches from the head, or from the owner, and gets the right
// bytes; every loan ends.
func TestRelayPushRefused(t *testing.T) {
	for _, how := range []string{"no putter", "not held"} {
		t.Run(how, func(t *testing.T) {
			t.Cleanup(SetRelayGrace(time.Nanosecond))
			memtestPuts.Store(0)
			cfg := pushConfig()
			if how == "no putter" {
				cfg.Channels = noPutChannels()
			}
			owner, head, others := pushMesh(t, cfg, 2)
			other := others[0]
			x := newTensor(t, relayTestBytes, 3)
			refs := lendRefs(t, owner, []*Engine{head, other}, x)
			var f fetched
			if how == "not held" {
				_ = refs[0].Release(context.Background())
				f = <-fetchOn(refs[1:], context.Background())
			} else {
				open := holdFetches(t)
				content := refs[0].Descriptor().Content
				hch := fetchOn(refs[:1], context.Background())
				waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 0 })
				och := fetchOn(refs[1:], context.Background())
				// Its push refused, the other fetches from the head.
				waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, content) == 2 })
				open()
				hf := <-hch
				if hf.err != nil {
					t.Fatal(hf.err)
				}
				_ = hf.t.Free()
				f = <-och
			}
			if f.err != nil || f.t.Host()[0] != 3 || f.t.Host()[relayTestBytes-1] != 3 {
				t.Fatalf("other: %v, %v", f.t, f.err)
			}
			_ = f.t.Free()
			waitFor(t, func() bool { return allIdle(owner, head, other) && x.Leases() == 0 })
			s := other.Stats()
			if s.RelayPushed != 0 || memtestPuts.Load() != 0 {
				t.Fatalf("pushed %d, %d pieces", s.RelayPushed, memtestPuts.Load())
			}
			switch how {
			case "no putter":
				if s.RelayFetched != 1 || s.RelayFallbacks != 0 || s.ByPeer[head.cfg.Node]["memtest"].Transfers != 1 {
					t.Fatalf("relayed %d, fell back %d, %+v", s.RelayFetched, s.RelayFallbacks, s.ByPeer)
				}
			default:
				if s.RelayFetched != 0 || s.RelayFallbacks != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
					t.Fatalf("relayed %d, fell back %d, %+v", s.RelayFetched, s.RelayFallbacks, s.ByPeer)
				}
			}
		})
	}
}

// TestRelayPushHolderFails: the head's own fetch fails after it wrote
// its first piece into the other's destination: its put fails, and the
// other fetches from the owner (the head holds nothing now) and gets the
// right bytes; every loan ends.
func TestRelayPushHolderFails(t *testing.T) {
	const pieces = 4
	memtestInPieces(t, pieces)
	t.Cleanup(SetRelayGrace(time.Nanosecond))
	memtestPuts.Store(0)
	owner, head, others := pushMesh(t, pushConfig(), 2)
	other := others[0]
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
	// The head's put of its first piece waits at the gate beside its
	// fetch of the second, which fails.
	waitFor(t, func() bool { return memtestWaiting.Load() == 2 })
	cancel()
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 })
	pass()
	waitFor(t, func() bool { return memtestPuts.Load() == 1 })
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
	waitFor(t, func() bool { return allIdle(owner, head, other) && x.Leases() == 0 })
	if s := other.Stats(); s.RelayPushed != 0 || s.RelayFetched != 0 || s.RelayFallbacks != 1 || s.ByPeer[owner.cfg.Node]["memtest"].Transfers != 1 {
		t.Fatalf("other: pushed %d, relayed %d, fell back %d, %+v", s.RelayPushed, s.RelayFetched, s.RelayFallbacks, s.ByPeer)
	}
}

// TestRelayPushBadRequests: a push request whose destination is not the
// asker's, is not lent to the node asked, has another size than the
// content, or comes with trailing bytes or none, gets an error, joins no
// flight, writes nothing and ends no loan.
func TestRelayPushBadRequests(t *testing.T) {
	memtestPuts.Store(0)
	owner, head, others := pushMesh(t, pushConfig(), 2)
	other := others[0]
	x := newTensor(t, relayTestBytes, 2)
	refs := lendRefs(t, owner, []*Engine{head}, x)
	open := holdFetches(t)
	ch := fetchOn(refs, context.Background())
	d := refs[0].Descriptor()
	waitFor(t, func() bool { return head.relayJoined(owner.cfg.Node, 1, d.Content) == 0 })
	lend := func(n int64, holder string) *tensor.Descriptor {
		dst := newTensor(t, n, 0)
		_, rd, err := other.store.Export(dst, holder, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return rd
	}
	good := lend(relayTestBytes, head.cfg.Node)
	push := func(rd *tensor.Descriptor) []byte {
		return encodeRelayAsk(relayAsk{op: relayPush, d: contentOf(d), rd: rd})
	}
	// pushAlone is a push request without its destination.
	pushAlone := func() []byte {
		b := encodeRelayAsk(relayAsk{op: relayStream, d: contentOf(d)})
		b[0] = relayPush // a positive fixint
		return b
	}
	withCount := push(good)
	withCount[1] = 1 // n, a positive fixint
	for _, c := range []struct {
		name string
		from string
		req  []byte
	}{
		{"another owner's", owner.cfg.Node, push(good)},
		{"lent to another", other.cfg.Node, push(lend(relayTestBytes, owner.cfg.Node))},
		{"wrong size", other.cfg.Node, push(lend(relayTestBytes/2, head.cfg.Node))},
		{"empty", other.cfg.Node, nil},
		{"no destination", other.cfg.Node, pushAlone()},
		{"garbage destination", other.cfg.Node, append(pushAlone(), 0xc1)},
		{"trailing", other.cfg.Node, append(push(good), 0)},
		{"with a count", other.cfg.Node, withCount},
	} {
		if b, err := head.serveRelay(context.Background(), c.from, c.req); err == nil {
			t.Fatalf("%s: answered %x", c.name, b)
		}
	}
	if n := head.relayJoined(owner.cfg.Node, 1, d.Content); n != 0 {
		t.Fatalf("%d requests joined", n)
	}
	if n, puts := other.Store().Len(), memtestPuts.Load(); n != 3 || puts != 0 {
		t.Fatalf("%d of the 3 destinations lent, %d pieces written", n, puts)
	}
	open()
	f := <-ch
	if f.err != nil {
		t.Fatal(f.err)
	}
	_ = f.t.Free()
	other.store.ReleaseHolder(head.cfg.Node)
	other.store.ReleaseHolder(owner.cfg.Node)
	waitFor(t, func() bool { return allIdle(owner, head, other) })
}

// TestRelayPushAskerCancels: a receiver whose fetch is cancelled while
// the head writes its destination keeps that destination lent (and
// neither delivers nor frees it) until the head's put ended, which ends
// the loan; then every loan has ended.
func TestRelayPushAskerCancels(t *testing.T) {
	const pieces = 2
	memtestInPieces(t, pieces)
	memtestPuts.Store(0)
	owner, head, others := pushMesh(t, pushConfig(), 2)
	other := others[0]
	x := newTensor(t, relayTestBytes, 9)
	refs := lendRefs(t, owner, []*Engine{head, other}, x)
	content := refs[0].Descriptor().Content
	open, pass := holdFetchesOneByOne(t)
	hch := fetchOn(refs[:1], context.Background())
	waitFor(t, func() bool { return memtestWaiting.Load() == 1 })
	pass()
	waitFor(t, func() bool {
		return head.relayLanded(owner.cfg.Node, 1, content) == relayTestBytes/pieces && memtestWaiting.Load() == 1
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	och := fetchOn(refs[1:], ctx)
	waitFor(t, func() bool { return memtestWaiting.Load() == 2 }) // the head's put of its first piece
	cancel()
	waitFor(t, func() bool {
		other.ctlMu.Lock()
		defer other.ctlMu.Unlock()
		return len(other.ctlWait) == 0 // the push request gave up
	})
	if n := other.Store().Len(); n != 1 {
		t.Fatalf("%d loans of the destination while the head writes it, want 1", n)
	}
	open()
	if f := <-och; f.err == nil {
		t.Fatal("the cancelled fetch succeeded")
	}
	if f := <-hch; f.err != nil {
		t.Fatal(f.err)
	} else {
		_ = f.t.Free()
	}
	if n := memtestPuts.Load(); n != pieces {
		t.Fatalf("%d pieces put, want %d", n, pieces)
	}
	waitFor(t, func() bool { return allIdle(owner, head, other) && x.Leases() == 0 })
}
