package actor

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
)

// TestReplyIDsNeverMatchFutures: protoactor's own future ids must never be
// taken for Request reply addresses (their replies would be lost).
func TestReplyIDsNeverMatchFutures(t *testing.T) {
	sys := pa.NewActorSystem()
	defer sys.Shutdown()
	for range 5000 {
		f := pa.NewFuture(sys, time.Minute)
		if _, ok := replyKey(f.PID().Id); ok || isReply(f.PID().Id) {
			t.Fatalf("future id %q parsed as a reply address", f.PID().Id)
		}
		if !isFuture(f.PID()) {
			t.Fatalf("future id %q not seen as a future", f.PID().Id)
		}
		sys.Root.Send(f.PID(), nil)
	}
	for _, id := range []string{"future#", "future#zz!", "future#" + "1" + string(make([]byte, 20))} {
		if _, ok := replyKey(id); ok {
			t.Fatalf("replyKey(%q) accepted", id)
		}
	}
	if k, ok := replyKey("future#z"); !ok || k != 35 {
		t.Fatalf("replyKey(future#z) = %d, %v", k, ok)
	}
}

// TestReplyGoesByKey: a message to a Request reply address travels with
// the request's key alone, which names the same address again; any other
// target, protoactor's futures and a key of 0 included, travels as is.
func TestReplyGoesByKey(t *testing.T) {
	for _, key := range []uint64{1, 35, 36, 1 << 40, ^uint64(0)} {
		var m wire.Message
		fillMessage(&m, pa.NewPID("a", replyID(key)), nil, nil)
		if m.Target != "" || m.Request != key {
			t.Fatalf("reply to key %d: target %q, request %d", key, m.Target, m.Request)
		}
		if k, ok := replyKey(replyID(key)); !ok || k != key {
			t.Fatalf("replyKey(replyID(%d)) = %d, %v", key, k, ok)
		}
		in := inbound{m: &m, reply: true, key: m.Request}
		if pid := in.targetPID(&Node{self: config.NodeConfig{Name: "a"}}); m.Target != replyID(key) || pid.Id != replyID(key) || pid.Address != "a" {
			t.Fatalf("targetPID = %v (target %q), want %q", pid, m.Target, replyID(key))
		}
	}
	for _, id := range []string{"echo", "future$abc", "future#0", "future#zz!", ""} {
		var m wire.Message
		fillMessage(&m, pa.NewPID("a", id), nil, pa.NewPID("b", "s"))
		if m.Target != id || m.Request != 0 || m.SenderNode != "b" || m.SenderID != "s" {
			t.Fatalf("target %q: got %+v", id, m)
		}
	}
}

// TestReplyKeysUnguessable: a reply is taken from any peer, so a request's
// key must not be guessable. Keys are random: forged replies under the
// first 100 000 keys, which a counter would hand out first, complete
// nothing; the request's own key completes it.
func TestReplyKeysUnguessable(t *testing.T) {
	n := &Node{log: zap.NewNop()}
	w := replyWaits.Get().(*replyWait)
	r := &n.replies
	r.mu.Lock()
	r.m = map[uint64]*replyWait{}
	key := newReplyKey(r.m)
	r.m[key] = w
	r.mu.Unlock()
	if key < 100_000 {
		t.Fatalf("key %d is among the first 100 000", key) // 1 in 2^47 by chance
	}
	for k := range uint64(100_000) {
		n.completeReplyKey(k, "", "forged", nil)
	}
	if w.ready() {
		t.Fatalf("a forged reply completed the request: %v", w.res.msg)
	}
	n.completeReplyKey(key, "", "real", nil)
	if !w.ready() || w.res.msg != "real" {
		t.Fatalf("reply = %v, want real", w.res.msg)
	}
	seen := map[uint64]*replyWait{}
	for range 10_000 {
		k := newReplyKey(seen)
		if k == 0 || seen[k] != nil {
			t.Fatalf("key %d is zero or taken", k)
		}
		seen[k] = w
	}
}

// TestReplyWaitHandOff: a result sent before the caller blocks is taken
// from the wait itself; one sent while the caller blocks comes on the
// channel; either way the wait goes back to the pool empty.
func TestReplyWaitHandOff(t *testing.T) {
	w := replyWaits.Get().(*replyWait)
	w.send(replyResult{msg: "early"})
	if !w.ready() || w.state.Load() != replyDone || len(w.ch) != 0 || w.res.msg != "early" {
		t.Fatalf("early result: state %d, %d on ch, res %v", w.state.Load(), len(w.ch), w.res.msg)
	}
	w.done()
	if w.state.Load() != replyPending || w.res.msg != nil {
		t.Fatalf("after done: state %d, res %v", w.state.Load(), w.res.msg)
	}
	w = replyWaits.Get().(*replyWait)
	if !w.state.CompareAndSwap(replyPending, replyBlocking) {
		t.Fatal("a new wait is not pending")
	}
	go w.send(replyResult{msg: "late"})
	if res := <-w.ch; res.msg != "late" || w.ready() {
		t.Fatalf("late result: %v, ready %v", res.msg, w.ready())
	}
	w.done()
}

// TestReplyIDMatchesStrconv: replyID writes what strconv.FormatUint(key, 36)
// writes, and replyKey accepts exactly what strconv.ParseUint(s, 36, 64)
// accepts, with the same value.
func TestReplyIDMatchesStrconv(t *testing.T) {
	keys := []uint64{0, 1, 35, 36, 37, 1295, 1296, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, ^uint64(0)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		keys = append(keys, r.Uint64()>>r.IntN(64))
	}
	for _, key := range keys {
		if got, want := replyID(key), replyPrefix+strconv.FormatUint(key, 36); got != want {
			t.Fatalf("replyID(%d) = %q, want %q", key, got, want)
		}
	}
	tails := []string{"", "0", "z", "Z", "00", "3w5e11264sgsf", "3w5e11264sgsg", "3W5E11264SGSF", "zzzzzzzzzzzzz",
		"10000000000000", "0000000000000000001", "+1", "-1", "1_0", "_", " 1", "1 ", "é", "\x00", "a.b", "g", "G"}
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCXYZ_+-#!"
	for range 20000 {
		b := make([]byte, r.IntN(16))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		tails = append(tails, string(b))
	}
	for _, tail := range tails {
		want, err := strconv.ParseUint(tail, 36, 64)
		got, ok := replyKey(replyPrefix + tail)
		if ok != (err == nil) || got != want && ok {
			t.Fatalf("replyKey(%q) = %d, %v; strconv: %d, %v", replyPrefix+tail, got, ok, want, err)
		}
	}
}
