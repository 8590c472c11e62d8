package transfer_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/transfer"
	"go.uber.org/zap"
)

// hostsWeights is lent by an owner to receivers of another "host";
// hostsSum answers it with the hash of what arrived.
type hostsWeights struct{ W *tensor.Tensor }
type hostsSum struct{ Hash uint64 }

func init() {
	actor.MustRegisterMessage("transfer_test.Weights", &hostsWeights{})
	actor.MustRegisterMessage("transfer_test.Sum", &hostsSum{})
}

func hashOf(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// TestRelayTwoHosts: four nodes of one process stand for two hosts
// (actor.WithHostID): the owner alone on one, three receivers on the
// other. One tensor sent to an actor on each receiver crosses between the
// hosts once, over the real staging channel: the owner serves its bytes
// once, the first receiver lends its copy to the two others, and every
// receiver gets the tensor's bytes.
func TestRelayTwoHosts(t *testing.T) {
	t.Cleanup(transfer.SetRelayGrace(time.Minute)) // the plan, not the order of reads, is under test
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) { testRelayTwoHosts(t, stream) })
	}
}

// testRelayTwoHosts is TestRelayTwoHosts with flow.relay_stream stream.
func testRelayTwoHosts(t *testing.T, stream bool) {
	const size = 8 << 20
	cfg, err := config.LocalConfig("relayhosts", 4)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Flow.RelayMinBytes, cfg.Flow.NoRelayStream = 1<<20, !stream
	cfg.DisableChannels = []string{"memtest"} // this package's test double
	hosts := []string{"host-a", "host-b", "host-b", "host-b"}
	nodes := make([]*actor.Node, len(hosts))
	for i, nc := range cfg.Nodes {
		n, err := actor.NewNode(cfg, nc.Name, actor.WithHostID(hosts[i]), actor.WithLogger(zap.NewNop()))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
		nodes[i] = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	owner, recv := nodes[0], nodes[1:]
	for _, n := range recv {
		_, err := n.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
			if m, ok := c.Message().(*hostsWeights); ok {
				c.Respond(&hostsSum{Hash: hashOf(m.W.Host())})
				_ = m.W.Free()
			}
		}), "sum")
		if err != nil {
			t.Fatal(err)
		}
	}
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{size})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range x.Host() {
		x.Host()[i] = byte(rng.Uint32())
	}
	want := hashOf(x.Host())
	var futures []*pa.Future
	for _, n := range recv {
		futures = append(futures, owner.Root().RequestFuture(owner.PID(n.Name(), "sum"), &hostsWeights{W: x}, 30*time.Second))
	}
	for i, f := range futures {
		res, err := f.Result()
		if s, ok := res.(*hostsSum); err != nil || !ok || s.Hash != want {
			t.Fatalf("receiver %d: %#v, %v", i, res, err)
		}
	}
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatal(err)
	}
	if got := owner.Stats().Served[rdma.Staging].Bytes; got != size {
		t.Fatalf("the owner served %d bytes across the hosts, want one copy (%d)", got, size)
	}
	const loans = 2 // one per receiver that borrows the first one's copy
	served, fetched := 0, 0
	for _, n := range recv {
		s := n.Stats()
		if s.RelayFallbacks != 0 {
			t.Fatalf("%s fell back to the owner %d times", n.Name(), s.RelayFallbacks)
		}
		switch {
		case s.RelayServed == loans && s.Served[rdma.Staging].Bytes == 2*size:
			served++
		case s.RelayFetched == 1 && s.ByPeer[owner.Name()][rdma.Staging].Bytes == 0:
			fetched++
		default:
			t.Fatalf("%s: served %d, fetched %d by relay; %+v", n.Name(), s.RelayServed, s.RelayFetched, s.ByPeer)
		}
	}
	if served != 1 || fetched != 2 {
		t.Fatalf("%d heads, %d receivers fetching from one", served, fetched)
	}
}
