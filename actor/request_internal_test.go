package actor

import (
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
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
