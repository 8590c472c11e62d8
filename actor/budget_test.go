package actor_test

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
)

// stallingOwner is a peer holding the secret that joins the cluster with
// its own code: it describes tensors it never serves (its data connections
// are held open and never answered).
type stallingOwner struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (s *stallingOwner) PeerUp(*cluster.Peer)                  {}
func (s *stallingOwner) PeerDown(*cluster.Peer, error)         {}
func (s *stallingOwner) HandleFrame(*cluster.Peer, wire.Frame) {}
func (s *stallingOwner) HandleDataConn(_, _ string, c net.Conn) {
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}
func (s *stallingOwner) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

// tableEntry mirrors one entry of the tensor table (transfer/table.go).
type tableEntry struct {
	ID   uint64             `msgpack:"i"`
	Kind uint8              `msgpack:"k"`
	Desc *tensor.Descriptor `msgpack:"d"`
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestReceiverBudgetsHoldAgainstAStallingOwner: an authenticated peer
// sends 10,000 messages describing 16 GiB tensors, then 10,000 describing
// 16 MiB tensors, and never serves any. The receiver refuses the first
// (beyond its per-peer budget), allocates the second only within its
// budgets, refuses what exceeds the window it advertised, closes the
// peer's connection for it, keeps its heap bounded and keeps serving
// another peer.
func TestReceiverBudgetsHoldAgainstAStallingOwner(t *testing.T) {
	cfg, err := config.LocalConfig("test", 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Flow.ReceiveBudget = 64 << 20
	cfg.Flow.ReceiveBudgetPerPeer = 32 << 20
	cfg.Flow.TransferTimeout = time.Minute
	recv, err := actor.NewNode(cfg, "node0", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	honest, err := actor.NewNode(cfg, "node2", testLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*actor.Node{recv, honest} {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop() })
	}
	served := make(chan struct{}, 16)
	if _, err := recv.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if g, ok := c.Message().(*Grad); ok {
			_ = g.W.Free()
			if c.Sender() != nil {
				c.Respond(&Ping{})
			}
			select {
			case served <- struct{}{}:
			default:
			}
		}
	}), "sink"); err != nil {
		t.Fatal(err)
	}

	// The attacker: node1, with the secret, speaking the protocol itself.
	const inc = 77
	_, p := joinRaw(t, cfg, "node1", "node0", inc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := recv.WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	before := heapInUse()
	body := []byte{0x81, 0xa1, 'W', 0x92, 0x01, 0x01} // {W: [tensor field, id 1]}
	attack := func(size int64) (sent int) {
		for i := range 10000 {
			d := &tensor.Descriptor{Owner: "node1", Incarnation: inc, ExportID: uint64(i + 1), Lease: uint64(i + 7), DType: tensor.Uint8,
				Shape: tensor.Shape{size}, Bytes: size, Device: "cpu"}
			table, err := wire.EncodeMsgpack([]tableEntry{{ID: 1, Kind: 2, Desc: d}})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.SendMessage(ctx, &wire.Message{Target: "sink", Type: "test.Grad", Ser: wire.SerMsgpack, Body: body, Tensors: table}); err != nil {
				return i // the receiver closed the connection
			}
		}
		return 10000
	}
	// 16 GiB each: beyond the per-peer budget, refused at once.
	if n := attack(16 << 30); n != 10000 {
		t.Fatalf("the connection closed after %d messages beyond the budget", n)
	}
	// 16 MiB each: two fetches start and stall, the window fills, the
	// rest is refused, and the peer that keeps sending is disconnected.
	attack(16 << 20)
	waitUntil(t, func() bool { _, up := recv.Topology().Peers["node1"]; return !up || recv.Stats().InboxRefused >= 64 })
	if got := recv.Stats().BudgetInUse; got > int64(cfg.Flow.ReceiveBudgetPerPeer) {
		t.Fatalf("%d bytes allocated for the stalling peer's tensors, budget per peer %d", got, cfg.Flow.ReceiveBudgetPerPeer)
	}
	// The other peer is still served, within what remains of the budget.
	for range 3 {
		w, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := honest.Request(ctx, honest.PID("node0", "sink"), &Grad{W: w}); err != nil {
			t.Fatalf("the honest peer is not served: %v", err)
		}
		_ = w.WaitReleased(ctx)
		_ = w.Free()
	}
	t.Logf("receiver: %+v", recv.Stats())
	after := heapInUse()
	// The stalled fetches hold at most the per-peer budget; the rest is
	// bookkeeping. 20,000 messages without budgets would hold 160 GB.
	if bound := before + uint64(cfg.Flow.ReceiveBudgetPerPeer) + 64<<20; after > bound {
		t.Fatalf("heap in use grew from %d to %d bytes (bound %d)", before, after, bound)
	}
}
