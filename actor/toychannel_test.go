package actor_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// The toy channel is a channel that no package of tensorferry knows about:
// registered here, under a new name, it must be started by every node of
// this test binary and chosen where nothing better reaches. It moves bytes
// through Env.Control: the fetcher asks the owner for toyChunk bytes at a
// time and the owner answers from its Store.
const toyName = "toy"

// toyChunk is the most bytes one control reply carries.
const toyChunk = 1 << 20

func init() {
	rdma.MustRegister(rdma.Backend{
		Name:     toyName,
		Priority: 90, // after staging: the other tests never choose it
		Reach: func(_, _ *rdma.Caps, src, dst memory.Device) error {
			if !src.IsHost() || !dst.IsHost() {
				return fmt.Errorf("toy moves host memory only (%s -> %s)", src, dst)
			}
			return nil
		},
		New: func(env *rdma.Env) (rdma.Channel, error) { return newToy(env) },
	})
}

var errToyBad = errors.New("toy: bad control message")

var toyCodes = rdma.ControlErrors(errToyBad)

type toyRequest struct {
	Incarnation uint64 `msgpack:"i"`
	ExportID    uint64 `msgpack:"e"`
	Lease       uint64 `msgpack:"l"`
	Offset      int64  `msgpack:"o"`
	Len         int    `msgpack:"n"`
}

type toyReply struct {
	Code wire.ErrCode `msgpack:"c"`
	Msg  string       `msgpack:"m"`
	Data []byte       `msgpack:"d"`
}

type toyChannel struct {
	env      *rdma.Env
	mu       sync.RWMutex // held for reading while serving, for writing by Close
	closed   atomic.Bool
	inFlight atomic.Int64
}

var (
	_ rdma.Channel        = (*toyChannel)(nil)
	_ rdma.ControlHandler = (*toyChannel)(nil)
)

func newToy(env *rdma.Env) (*toyChannel, error) {
	if env == nil || env.Store == nil || env.Control == nil {
		return nil, errors.New("toy: Env with a Store and Control required")
	}
	return &toyChannel{env: env}, nil
}

func (c *toyChannel) Name() string { return toyName }

func (c *toyChannel) Offer(context.Context, *tensor.Export, string) ([]byte, error) { return nil, nil }

// InFlight counts control requests being served (rdmatest checks it).
func (c *toyChannel) InFlight() int { return int(c.inFlight.Load()) }

func (c *toyChannel) Fetch(ctx context.Context, d *tensor.Descriptor, dst memory.Buffer) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("toy: fetch: %w", err)
	}
	if int64(dst.Len()) < d.Bytes {
		return fmt.Errorf("toy: fetch %v into %d bytes: %w", d, dst.Len(), rdma.ErrTooSmall)
	}
	out := dst.Host()
	if out == nil {
		return fmt.Errorf("toy: fetch %v: destination %s is not host memory", d, dst.Device())
	}
	// One request at least, so that a descriptor of 0 bytes is checked too.
	for off := int64(0); off == 0 || off < d.Bytes; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("toy: fetch %v: %w", d, err)
		}
		if c.closed.Load() {
			return rdma.ErrClosed
		}
		n := int(min(d.Bytes-off, toyChunk))
		req, err := msgpack.Marshal(&toyRequest{Incarnation: d.Incarnation, ExportID: d.ExportID, Lease: d.Lease, Offset: off, Len: n})
		if err != nil {
			return err
		}
		b, err := c.env.Control(ctx, d.Owner, toyName, req)
		if err != nil {
			return fmt.Errorf("toy: fetch %v: %w", d, err)
		}
		var rep toyReply
		if err := rdma.DecodeControl(b, toyChunk+1024, &rep, errToyBad, "reply"); err != nil {
			return err
		}
		if err := rdma.ReplyError(toyCodes, toyName, d.Owner, rep.Code, rep.Msg); err != nil {
			return err
		}
		if len(rep.Data) != n {
			return fmt.Errorf("%w: %d bytes for a request of %d", errToyBad, len(rep.Data), n)
		}
		copy(out[off:], rep.Data)
		off += int64(n)
		if n == 0 {
			break
		}
	}
	return nil
}

// HandleControl answers a fetcher's request with bytes of an export.
func (c *toyChannel) HandleControl(_ context.Context, _ string, b []byte) ([]byte, error) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	data, err := c.serve(b)
	rep := toyReply{Data: data}
	if err != nil {
		rep.Code, rep.Msg = toyCodes.Code(err), err.Error()
	}
	return msgpack.Marshal(&rep)
}

func (c *toyChannel) serve(b []byte) ([]byte, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed.Load() {
		return nil, rdma.ErrClosed
	}
	var req toyRequest
	if err := rdma.DecodeControl(b, 1024, &req, errToyBad, "request"); err != nil {
		return nil, err
	}
	e, done, err := c.env.Store.Acquire(req.Incarnation, req.ExportID, req.Lease)
	if err != nil {
		return nil, err
	}
	defer done()
	src := e.Tensor.Buffer().Host()
	if src == nil {
		return nil, fmt.Errorf("toy: export %d is not in host memory", req.ExportID)
	}
	if req.Offset < 0 || req.Len < 0 || req.Len > toyChunk || req.Offset+int64(req.Len) > int64(len(src)) {
		return nil, fmt.Errorf("%w: range [%d, +%d) outside the export's %d bytes", errToyBad, req.Offset, req.Len, len(src))
	}
	return append([]byte(nil), src[req.Offset:req.Offset+int64(req.Len)]...), nil
}

func (c *toyChannel) PeerDown(string) {}

func (c *toyChannel) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed.Store(true)
	return nil
}

// TestToyChannelEndToEnd moves tensors between two nodes through a channel
// registered by this test only: with staging disabled, nothing else
// reaches between two nodes without GPUs or RDMA.
func TestToyChannelEndToEnd(t *testing.T) {
	cfg, err := config.LocalConfig("toy", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DisableChannels = []string{rdma.Staging}
	nodes := startNodes(t, cfg)
	a, b := nodes[0], nodes[1]
	spawnTestActors(b)
	rng := rand.New(rand.NewPCG(7, 8))
	var want int64
	for _, shape := range []tensor.Shape{{1 << 18}, {3<<18 + 5}} { // above the inline threshold; 1 MiB and 3 MiB+
		x := randomTensor(t, rng, tensor.Float32, shape)
		want += x.ByteSize()
		res, err := a.Root().RequestFuture(a.PID(b.Name(), "tensors"), &Grad{W: x}, 30*time.Second).Result()
		checkDigest(t, res, err, x) // bit-exact: same hash, dtype and shape
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = x.WaitReleased(ctx)
		cancel()
		if err != nil {
			t.Fatalf("lease not released: %v", err)
		}
	}
	st := b.Stats().Channels[toyName]
	if st.Bytes != want || st.Transfers != 2 {
		t.Fatalf("toy channel stats %+v, want %d bytes in 2 transfers (all: %+v)", st, want, b.Stats().Channels)
	}
}

// TestToyChannelConformance runs the rdmatest suite on the toy channel.
func TestToyChannelConformance(t *testing.T) {
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.InProcessPair(t, func(env *rdma.Env) (rdma.Channel, error) { return newToy(env) }, memory.CPU, memory.CPU)
	})
}

func TestWithChannelUnknownName(t *testing.T) {
	cfg, err := config.LocalConfig("toy", 1)
	if err != nil {
		t.Fatal(err)
	}
	pigeon := actor.WithChannel("carrier-pigeon", func(env *rdma.Env) (rdma.Channel, error) { return newToy(env) })
	n, err := actor.NewNode(cfg, cfg.Nodes[0].Name, testLogger(), pigeon)
	if err == nil { // refused by NewNode or, at the latest, by Start
		if err = n.Start(); err == nil {
			_ = n.Stop()
		}
	}
	if !errors.Is(err, rdma.ErrUnknownChannel) {
		t.Fatalf("a node with an unregistered channel: %v, want rdma.ErrUnknownChannel", err)
	}
	t.Log(err)
}
