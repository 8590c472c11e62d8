package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/tensor"
)

// Msg carries one tensor, fetched by the receiving node before delivery.
type Msg struct {
	T *tensor.Tensor
	// Check asks the receiver for the CRC-32 of the bytes it got.
	Check bool
}

// Ack answers a Msg once it was delivered.
type Ack struct {
	Bytes int64
	CRC   uint32
}

// Small is the 64-byte message of the round-trip figure, echoed back.
type Small struct {
	Payload []byte
}

func init() {
	tfactor.MustRegisterMessage("bench.transfer.Msg", &Msg{})
	tfactor.MustRegisterMessage("bench.transfer.Ack", &Ack{})
	tfactor.MustRegisterMessage("bench.transfer.Small", &Small{})
}

// nodes are two tensorferry nodes of one loopback cluster in this process,
// each with its own listeners: messages cross the real wire and tensors the
// staging channel's data connections.
// forcedChannel is the data channel the nodes use (--channel).
var forcedChannel = "staging"

type nodes struct {
	sender, receiver *tfactor.Node
	sink             *pa.PID // the receiving actor, as the sender sees it
	timeout          time.Duration
}

func quietLogger(*pa.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }

// openNodes starts both nodes, waits until they see each other and spawns
// the receiving actor.
func openNodes(o options) (*nodes, error) {
	cfg, err := config.LocalConfig("bench-transfer", 2)
	if err != nil {
		return nil, err
	}
	// A 1 GiB message keeps both cores of a small host busy for a while:
	// heartbeats must not declare the peer dead meanwhile.
	cfg.HeartbeatInterval, cfg.FailureTimeout = 500*time.Millisecond, 10*time.Second
	cfg.Flow.TransferTimeout = o.timeout
	if o.chunk > 0 {
		cfg.Staging.ChunkSize = o.chunk
	}
	if o.inflight > 0 {
		cfg.Staging.ChunksInFlight = o.inflight
	}
	// Only the channel being measured may move the bytes.
	for _, ch := range []string{"ipc", "staging", "verbs"} {
		if ch != forcedChannel {
			cfg.DisableChannels = append(cfg.DisableChannels, ch)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	quiet := tfactor.WithSystemConfig(pa.WithLoggerFactory(quietLogger), pa.WithDeadLetterThrottleInterval(10*time.Millisecond))
	n := &nodes{timeout: o.timeout}
	if n.receiver, err = tfactor.NewNode(cfg, cfg.Nodes[1].Name, quiet); err != nil {
		return nil, err
	}
	if n.sender, err = tfactor.NewNode(cfg, cfg.Nodes[0].Name, quiet); err != nil {
		return nil, err
	}
	if err := n.receiver.Start(); err != nil {
		return nil, err
	}
	if err := n.sender.Start(); err != nil {
		return nil, errors.Join(err, n.receiver.Stop())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.sender.WaitPeer(ctx, n.receiver.Name()); err != nil {
		return nil, errors.Join(err, n.close())
	}
	props := pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *Msg:
			ack := &Ack{Bytes: m.T.ByteSize()}
			if m.Check {
				ack.CRC = crc32.ChecksumIEEE(m.T.Host())
			}
			_ = m.T.Free()
			c.Respond(ack)
		case *Small:
			c.Respond(m)
		}
	})
	if _, err := n.receiver.Root().SpawnNamed(props, "sink"); err != nil {
		return nil, errors.Join(fmt.Errorf("transfer: spawn: %w", err), n.close())
	}
	n.sink = n.sender.PID(n.receiver.Name(), "sink")
	return n, nil
}

// send sends x in one message and waits for its Ack; check asks the
// receiver to verify the bytes against want. It returns the time from
// RequestFuture until the Ack, then waits (untimed) until x's lease is back.
func (n *nodes) send(x *tensor.Tensor, check bool, want uint32) (time.Duration, error) {
	t0 := time.Now()
	res, err := n.sender.Root().RequestFuture(n.sink, &Msg{T: x, Check: check}, n.timeout).Result()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("transfer: %v: %w", x, err)
	}
	ack, ok := res.(*Ack)
	switch {
	case !ok:
		return 0, fmt.Errorf("transfer: %v: reply %T %v", x, res, res)
	case ack.Bytes != x.ByteSize():
		return 0, fmt.Errorf("transfer: %v: receiver got %d bytes", x, ack.Bytes)
	case check && ack.CRC != want:
		return 0, fmt.Errorf("transfer: %v: receiver's CRC-32 %08x, sent %08x", x, ack.CRC, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	if err := x.WaitReleased(ctx); err != nil {
		return 0, fmt.Errorf("transfer: %v: lease not released: %w", x, err)
	}
	return d, nil
}

// roundTrip sends one Small and waits for the echo.
func (n *nodes) roundTrip(m *Small) error {
	res, err := n.sender.Root().RequestFuture(n.sink, m, n.timeout).Result()
	if err != nil {
		return fmt.Errorf("transfer: small message: %w", err)
	}
	if e, ok := res.(*Small); !ok || len(e.Payload) != len(m.Payload) {
		return fmt.Errorf("transfer: small message: reply %T", res)
	}
	return nil
}

// fetched returns the counters of the measured channel on the receiving
// node.
func (n *nodes) fetched() tfactor.ChannelStats {
	return n.receiver.Stats().Channels[forcedChannel]
}

func (n *nodes) close() error {
	var errs []error
	if n.sender != nil {
		errs = append(errs, n.sender.Stop())
	}
	if n.receiver != nil {
		errs = append(errs, n.receiver.Stop())
	}
	return errors.Join(errs...)
}
