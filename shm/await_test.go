//go:build linux

package shm

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/wire"
)

// TestWireCallerReadsRings: a wire.Conn on the rings lets a caller waiting
// for its reply read the rings itself (wire.Conn.Await): after the first
// round trips the replies are handled on the callers' goroutines, and a
// caller whose ctx ends while it waits on the rings returns.
func TestWireCallerReadsRings(t *testing.T) {
	for _, spin := range []time.Duration{-1, 20 * time.Microsecond} {
		t.Run(map[bool]string{true: "asleep", false: "spinning"}[spin < 0], func(t *testing.T) {
			a, b := connPair(t, MinRingSize, spin)
			var srv *wire.Conn
			srv = wire.NewConn(b, wire.Remote{Node: "client"}, wire.ConnOptions{DirectWrite: true, Handler: func(f wire.Frame) {
				if m, ok := f.(*wire.MessageFrame); ok && m.Message.Request%1000 != 999 {
					_ = srv.Send(context.Background(), wire.FrameMessage, 0, 0, &wire.Message{Target: "reply", Request: m.Message.Request})
				}
			}})
			replies := make(chan uint64, 1)
			var byCaller, byReader atomic.Int64
			cli := wire.NewConn(a, wire.Remote{Node: "server"}, wire.ConnOptions{Handler: func(f wire.Frame) {
				m, ok := f.(*wire.MessageFrame)
				if !ok {
					return
				}
				buf := make([]byte, 64<<10)
				if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "wire.(*Conn).Await") {
					byCaller.Add(1)
				} else {
					byReader.Add(1)
				}
				replies <- m.Message.Request
			}})
			srv.Start()
			cli.Start()
			defer func() {
				cli.Close(nil)
				srv.Close(nil)
			}()
			request := func(ctx context.Context, id uint64) error {
				if err := cli.Send(ctx, wire.FrameMessage, 0, 0, &wire.Message{Target: "echo", Request: id}); err != nil {
					return err
				}
				var w wire.Waiter
				if cli.Await(ctx, &w, func() bool { return len(replies) > 0 }) {
					t.Fatal("Await: callers cannot read the rings")
				}
				select {
				case got := <-replies:
					if got != id {
						t.Fatalf("reply %d to request %d", got, id)
					}
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			const n = 200
			for i := uint64(1); i <= n; i++ {
				if err := request(context.Background(), i); err != nil {
					t.Fatal(err)
				}
			}
			if c := byCaller.Load(); c < n/2 {
				t.Fatalf("%d of %d replies read by the waiting caller (%d by the reader goroutine), want most", c, n, byReader.Load())
			}
			// A caller waiting on the rings for a reply that never comes
			// returns when its ctx ends, and the next one is served.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			err := request(ctx, 999)
			cancel()
			if err == nil {
				t.Fatal("an unanswered request returned without its ctx's error")
			}
			if err := request(context.Background(), n+1); err != nil {
				t.Fatal(err)
			}
		})
	}
}
