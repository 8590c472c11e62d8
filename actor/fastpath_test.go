package actor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
)

// TestFastPathSwitches: with every fast path of the control path switched
// off, and with every one switched on (whatever the host and
// TENSORFERRY_FASTPATHS say), over shared memory and over TCP, requests
// through Node.Request and protoactor's RequestFuture are answered and a
// burst of one-way messages arrives whole and in order.
func TestFastPathSwitches(t *testing.T) {
	for _, c := range []struct{ on, tcp bool }{{false, false}, {true, false}, {true, true}} {
		on := c.on
		t.Run(fmt.Sprintf("on %v tcp %v", on, c.tcp), func(t *testing.T) {
			cfg, err := config.LocalConfig("test", 2)
			if err != nil {
				t.Fatal(err)
			}
			s, spin := config.SwitchOff, config.ReadSpinOff
			if on {
				s, spin = config.SwitchOn, 50*time.Microsecond
			}
			tr := &cfg.Transport
			tr.ReadSpin, tr.ReadSpinDetach, tr.CallerReads, tr.BurstDecode, tr.InlineDelivery, tr.DirectWrite = spin, s, s, s, s, s
			nodes := startNodes(t, cfg, actor.WithSharedMemory(shm.Config{Disable: c.tcp}))
			a, b := nodes[0], nodes[1]
			if got := a.PeerTransport(b.Name()); c.tcp && got != "tcp" {
				t.Fatalf("control connection over %q, want tcp", got)
			}
			if actor.LazyDecode(b) != on {
				t.Errorf("burst decode %v, want %v", actor.LazyDecode(b), on)
			}
			if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
				if p, ok := c.Message().(*Ping); ok {
					c.Respond(&Pong{N: p.N, From: b.Name()})
				}
			}, b.WithInlineDelivery()), "echo"); err != nil {
				t.Fatal(err)
			}
			const burst = 5000
			var next atomic.Int64
			all := make(chan struct{})
			if _, err := b.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
				if p, ok := c.Message().(*Ping); ok {
					if int64(p.N) != next.Load() {
						t.Errorf("message %d arrived as number %d", p.N, next.Load())
					}
					if next.Add(1) == burst {
						close(all)
					}
				}
			}, b.WithInlineDelivery()), "sink"); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			echo := a.PID(b.Name(), "echo")
			for i := range 200 {
				res, err := a.Request(ctx, echo, &Ping{N: i})
				if pong, ok := res.(*Pong); err != nil || !ok || pong.N != i {
					t.Fatalf("Request %d: %#v, %v", i, res, err)
				}
				res, err = a.Root().RequestFuture(echo, &Ping{N: i}, 10*time.Second).Result()
				if pong, ok := res.(*Pong); err != nil || !ok || pong.N != i {
					t.Fatalf("RequestFuture %d: %#v, %v", i, res, err)
				}
			}
			sink := a.PID(b.Name(), "sink")
			for i := range burst {
				a.Root().Send(sink, &Ping{N: i})
			}
			select {
			case <-all:
			case <-ctx.Done():
				t.Fatalf("%d of %d one-way messages arrived", next.Load(), burst)
			}
		})
	}
}
