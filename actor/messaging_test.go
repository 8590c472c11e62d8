package actor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/cluster"
)

// recorder collects the Ping numbers it receives and the Terminated it sees.
type recorder struct {
	mu      sync.Mutex
	got     []int
	terms   []*pa.Terminated
	ch      chan struct{}
	started chan struct{} // closed once the actor started (and watched)
}

func newRecorder() *recorder {
	return &recorder{ch: make(chan struct{}, 1<<16), started: make(chan struct{})}
}

func (r *recorder) props(watch *pa.PID) *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *pa.Started:
			if watch != nil {
				c.Watch(watch)
			}
			close(r.started)
		case *Ping:
			r.mu.Lock()
			r.got = append(r.got, m.N)
			r.mu.Unlock()
			r.ch <- struct{}{}
		case *pa.Terminated:
			r.mu.Lock()
			r.terms = append(r.terms, m)
			r.mu.Unlock()
			r.ch <- struct{}{}
		}
	})
}

func (r *recorder) wait(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for range n {
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %d events", d, n)
		}
	}
}

func TestOneWayOrderThreeNodes(t *testing.T) {
	_, nodes := startCluster(t, 3)
	c := nodes[2]
	rec := newRecorder()
	if _, err := c.Root().SpawnNamed(rec.props(nil), "sink"); err != nil {
		t.Fatal(err)
	}
	const perSender = 2000
	var wg sync.WaitGroup
	for _, from := range nodes[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid := from.PID(c.Name(), "sink")
			base := 0
			if from == nodes[1] {
				base = perSender
			}
			for i := range perSender {
				from.Root().Send(pid, &Ping{N: base + i})
			}
		}()
	}
	wg.Wait()
	rec.wait(t, 2*perSender, 20*time.Second)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// Each sender's messages arrive in the order it sent them.
	next := [2]int{0, perSender}
	for _, n := range rec.got {
		s := n / perSender
		if n != next[s] {
			t.Fatalf("sender %d: got %d, want %d", s, n, next[s])
		}
		next[s]++
	}
}

func TestWatchAcrossNodes(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	target, err := b.Root().SpawnNamed(echoProps(b.Name()), "watched")
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	remote := a.PID(b.Name(), target.Id)
	if _, err := a.Root().SpawnNamed(rec.props(remote), "watcher"); err != nil {
		t.Fatal(err)
	}
	// Make sure the watch reached b before stopping the actor: a request
	// sent after it on the same connection is answered after it.
	<-rec.started
	if _, err := a.Root().RequestFuture(remote, &Ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	// Stop from a, through the remote PID.
	a.Root().Stop(remote)
	rec.wait(t, 1, 5*time.Second)
	rec.mu.Lock()
	term := rec.terms[0]
	rec.mu.Unlock()
	if term.Who.Address != b.Name() || term.Who.Id != target.Id {
		t.Fatalf("Terminated.Who = %v, want %v", term.Who, remote)
	}
	if term.Why != pa.TerminatedReason_Stopped {
		t.Fatalf("Terminated.Why = %v, want Stopped", term.Why)
	}
}

func TestWatchMissingActorTerminatesAtOnce(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	rec := newRecorder()
	if _, err := a.Root().SpawnNamed(rec.props(a.PID(b.Name(), "ghost")), "watcher"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, 1, 5*time.Second)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.terms[0].Why != pa.TerminatedReason_NotFound {
		t.Fatalf("Why = %v, want NotFound", rec.terms[0].Why)
	}
}

func TestPoisonAcrossNodes(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	if _, err := b.Root().SpawnNamed(echoProps(b.Name()), "victim"); err != nil {
		t.Fatal(err)
	}
	remote := a.PID(b.Name(), "victim")
	if err := a.Root().PoisonFuture(remote).Wait(); err != nil {
		t.Fatalf("PoisonFuture: %v", err)
	}
	if _, ok := b.System().ProcessRegistry.GetLocal("victim"); ok {
		t.Fatal("actor still registered after poison")
	}
}

func TestNodeDownFailsPendingAndTerminatesWatchers(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	// An actor on b that never answers.
	if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(pa.Context) {}), "silent"); err != nil {
		t.Fatal(err)
	}
	remote := a.PID(b.Name(), "silent")
	rec := newRecorder()
	if _, err := a.Root().SpawnNamed(rec.props(remote), "watcher"); err != nil {
		t.Fatal(err)
	}
	downs := make(chan *cluster.NodeDown, 1)
	sub := a.System().EventStream.Subscribe(func(ev any) {
		if d, ok := ev.(*cluster.NodeDown); ok {
			downs <- d
		}
	})
	defer a.System().EventStream.Unsubscribe(sub)
	fut := a.Root().RequestFuture(remote, &Ping{}, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	_ = b.Stop()
	if _, err := fut.Result(); !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("pending request: err = %v, want ErrDeadLetter", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("pending request failed after %v", d)
	}
	rec.wait(t, 1, 5*time.Second)
	rec.mu.Lock()
	why := rec.terms[0].Why
	rec.mu.Unlock()
	if why != pa.TerminatedReason_AddressTerminated {
		t.Fatalf("Why = %v, want AddressTerminated", why)
	}
	select {
	case d := <-downs:
		if d.Node != b.Name() || d.Incarnation != b.Incarnation() {
			t.Fatalf("NodeDown = %+v", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no NodeDown")
	}
	// A request to the down node fails at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = ctx
	if _, err := a.Root().RequestFuture(remote, &Ping{}, 10*time.Second).Result(); !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("request to down node: %v", err)
	}
}
