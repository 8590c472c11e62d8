package actor_test

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// Grad carries a tensor that is fetched before delivery.
type Grad struct {
	Step int
	W    *tensor.Tensor
}

// RefMsg carries a lazily fetched tensor.
type RefMsg struct {
	R tensor.Ref
}

// ForwardRef asks the receiver to forward R to the tensors actor of Next,
// which answers the original sender.
type ForwardRef struct {
	R    tensor.Ref
	Next string
}

// Digest describes the tensor an actor received.
type Digest struct {
	Hash   uint64
	DType  tensor.DType
	Shape  tensor.Shape
	Device string
	Err    string
	// Via counts the transfers each channel made into the receiving node.
	Via map[string]int64
	// Reader counts the messages the receiving node fetched and delivered
	// on a connection's reader (StatsSnapshot.ReaderDeliveries).
	Reader int64
}

// Hold is never answered.
type Hold struct{}

// WaitPeers asks a node's tensors actor to wait until the named nodes are
// up; it answers with a Digest (Err set on failure).
type WaitPeers struct {
	Nodes []string
}

func init() {
	actor.MustRegisterMessage("test.Grad", &Grad{})
	actor.MustRegisterMessage("test.RefMsg", &RefMsg{})
	actor.MustRegisterMessage("test.ForwardRef", &ForwardRef{})
	actor.MustRegisterMessage("test.Digest", &Digest{})
	actor.MustRegisterMessage("test.Hold", &Hold{})
	actor.MustRegisterMessage("test.WaitPeers", &WaitPeers{})
}

func digest(t *tensor.Tensor) *Digest {
	host := t
	if !t.Device().IsHost() {
		var err error
		host, err = t.To(context.Background(), memory.CPU)
		if err != nil {
			return &Digest{Err: err.Error()}
		}
		defer host.Free()
	}
	h := fnv.New64a()
	h.Write(host.Host())
	return &Digest{Hash: h.Sum64(), DType: t.DType(), Shape: t.Shape(), Device: t.Device().String()}
}

// tensorProps answers Grad and RefMsg with a Digest of the tensor, forwards
// ForwardRef, and never answers Hold.
func tensorProps(node *actor.Node) *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *Grad:
			d := digest(m.W)
			d.Via = map[string]int64{}
			s := node.Stats()
			for name, st := range s.Channels {
				d.Via[name] = st.Transfers
			}
			d.Reader = s.ReaderDeliveries
			c.Respond(d)
			_ = m.W.Free()
		case *RefMsg:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t, err := m.R.Fetch(ctx, node.Device())
			if err != nil {
				c.Respond(&Digest{Err: err.Error()})
				return
			}
			c.Respond(digest(t))
			_ = t.Free()
		case *WaitPeers:
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, p := range m.Nodes {
				if p == node.Name() {
					continue
				}
				if err := node.WaitPeer(ctx, p); err != nil {
					c.Respond(&Digest{Err: err.Error()})
					return
				}
			}
			c.Respond(&Digest{})
		case *ForwardRef:
			c.RequestWithCustomSender(node.PID(m.Next, "tensors"), &RefMsg{R: m.R}, c.Sender())
		}
	})
}

func randomTensor(t *testing.T, rng *rand.Rand, dt tensor.DType, shape tensor.Shape) *tensor.Tensor {
	t.Helper()
	x, err := tensor.New(memory.CPU, dt, shape)
	if err != nil {
		t.Fatal(err)
	}
	b := x.Host()
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	if dt == tensor.Bool {
		for i := range b {
			b[i] &= 1
		}
	}
	return x
}

func checkDigest(t *testing.T, res any, err error, want *tensor.Tensor) {
	t.Helper()
	if err != nil {
		t.Fatalf("%v: %v", want, err)
	}
	d, ok := res.(*Digest)
	if !ok {
		t.Fatalf("%v: reply %T %v", want, res, res)
	}
	if d.Err != "" {
		t.Fatalf("%v: remote error: %s", want, d.Err)
	}
	w := digest(want)
	if d.Hash != w.Hash || d.DType != w.DType || !d.Shape.Equal(w.Shape) {
		t.Fatalf("%v: got %+v, want %+v", want, d, w)
	}
}

// sendTensors sends tensors of every dtype, inline and out of band, to the
// tensors actor of peer and checks what arrived.
func sendTensors(t *testing.T, a *actor.Node, peer string) {
	rng := rand.New(rand.NewPCG(1, 2))
	pid := a.PID(peer, "tensors")
	for _, dt := range tensor.AllDTypes() {
		for _, shape := range []tensor.Shape{{}, {0}, {3, 5}, {257, 129}, {1 << 19}} {
			x := randomTensor(t, rng, dt, shape)
			res, err := a.Root().RequestFuture(pid, &Grad{W: x}, 30*time.Second).Result()
			checkDigest(t, res, err, x)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := x.WaitReleased(ctx); err != nil {
				t.Fatalf("%v: lease not released: %v", x, err)
			}
			cancel()
		}
	}
	if n := a.Stats().Exports; n != 0 {
		t.Fatalf("%d exports left on the sender", n)
	}
}

func TestTensorsInProcess(t *testing.T) {
	_, nodes := startCluster(t, 2)
	spawnTestActors(nodes[1])
	sendTensors(t, nodes[0], nodes[1].Name())
	st := nodes[1].Stats()
	if st.Channels["staging"].Bytes == 0 {
		t.Fatalf("no bytes moved through staging: %+v", st.Channels)
	}
}

func TestTensorsAcrossProcesses(t *testing.T) {
	_, a, _ := processCluster(t, 2)
	sendTensors(t, a, "node1")
}

func TestRefForwardedFetchesFromOwner(t *testing.T) {
	_, a, _ := processCluster(t, 3)
	rng := rand.New(rand.NewPCG(3, 4))
	x := randomTensor(t, rng, tensor.Float32, tensor.Shape{1 << 18})
	res, err := a.Root().RequestFuture(a.PID("node1", "tensors"), &ForwardRef{R: tensor.NewRef(x), Next: "node2"}, 30*time.Second).Result()
	checkDigest(t, res, err, x)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		t.Fatalf("lease not released after the forwarded fetch: %v", err)
	}
}

func TestRefToOwnNode(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	spawnTestActors(a)
	spawnTestActors(b)
	x := randomTensor(t, rand.New(rand.NewPCG(5, 6)), tensor.Int32, tensor.Shape{100000})
	// a → b → back to a: a fetches its own export through the local channel.
	res, err := a.Root().RequestFuture(a.PID(b.Name(), "tensors"), &ForwardRef{R: tensor.NewRef(x), Next: a.Name()}, 30*time.Second).Result()
	checkDigest(t, res, err, x)
	if a.Stats().Channels["local"].Transfers != 1 {
		t.Fatalf("local channel not used: %+v", a.Stats().Channels)
	}
}
