package actor_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
)

// BenchmarkOneWay sends 64-byte messages from one node to an actor on
// another and waits until all arrived.
func BenchmarkOneWay(b *testing.B) { benchOneWay(b, false, false) }

// BenchmarkOneWayInline is BenchmarkOneWay to an actor with inline
// delivery, its bursts decoded by the reader (eager) or by the actor's
// goroutine (lazy, as on hosts with processors to spare).
func BenchmarkOneWayInline(b *testing.B) {
	b.Run("eager", func(b *testing.B) { benchOneWay(b, true, false) })
	b.Run("lazy", func(b *testing.B) { benchOneWay(b, true, true) })
}

// benchOneWay is BenchmarkOneWay; with inline, the sink has inline
// delivery and its bursts are decoded by its goroutine if lazy, by the
// reader if not.
func benchOneWay(b *testing.B, inline, lazy bool) {
	_, nodes := startClusterB(b, 2)
	a, c := nodes[0], nodes[1]
	var opts []pa.PropsOption
	if inline {
		actor.SetLazyDecode(c, lazy)
		opts = append(opts, c.WithInlineDelivery())
	}
	var got atomic.Int64
	done := make(chan struct{}, 1)
	target := int64(b.N)
	_, err := c.Root().SpawnNamed(pa.PropsFromFunc(func(ctx pa.Context) {
		if _, ok := ctx.Message().(*Ping); ok {
			if got.Add(1) == target {
				done <- struct{}{}
			}
		}
	}, opts...), "sink")
	if err != nil {
		b.Fatal(err)
	}
	pid := a.PID(c.Name(), "sink")
	msg := &Ping{Text: string(bytes.Repeat([]byte{'x'}, 64))}
	b.ResetTimer()
	for range b.N {
		a.Root().Send(pid, msg)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		b.Fatalf("only %d of %d arrived", got.Load(), b.N)
	}
}

// BenchmarkRoundTrip is one RequestFuture round trip of a 64-byte message.
func BenchmarkRoundTrip(b *testing.B) {
	_, nodes := startClusterB(b, 2)
	a, c := nodes[0], nodes[1]
	if _, err := c.Root().SpawnNamed(echoProps(c.Name()), "echo"); err != nil {
		b.Fatal(err)
	}
	pid := a.PID(c.Name(), "echo")
	msg := &Ping{Text: string(bytes.Repeat([]byte{'x'}, 64))}
	b.ResetTimer()
	for range b.N {
		if _, err := a.Root().RequestFuture(pid, msg, 5*time.Second).Result(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRequestInline is one Node.Request round trip of a 64-byte
// message to an actor with inline delivery, over the nodes' default control
// transport between processes of one host (shared memory) and over TCP.
func BenchmarkRequestInline(b *testing.B) {
	for _, bc := range []struct {
		name string
		shm  shm.Config
	}{{"shm", shm.Config{}}, {"tcp", shm.Config{Disable: true}}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg, err := config.LocalConfig("test", 2)
			if err != nil {
				b.Fatal(err)
			}
			nodes := startNodes(b, cfg, actor.WithSharedMemory(bc.shm))
			a, c := nodes[0], nodes[1]
			if _, err := c.Root().SpawnNamed(echoProps(c.Name()).Configure(c.WithInlineDelivery()), "echo"); err != nil {
				b.Fatal(err)
			}
			pid := a.PID(c.Name(), "echo")
			msg := &Ping{Text: string(bytes.Repeat([]byte{'x'}, 64))}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b.ResetTimer()
			for range b.N {
				if _, err := a.Request(ctx, pid, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
