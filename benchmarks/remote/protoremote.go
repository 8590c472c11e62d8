package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// protoRemotePath is protoactor-go's own remote: gRPC streams between two
// ActorSystems in this process, protobuf messages (wrapperspb.BytesValue
// carrying payloadSize bytes).
func protoRemotePath() path { return path{name: "protoactor-grpc", open: openProtoRemote} }

// requestTimeout bounds one RequestFuture.
const requestTimeout = 10 * time.Second

type protoRemote struct {
	client, server   *actor.ActorSystem
	clientR, serverR *remote.Remote
	echo, sink       *actor.PID // remote PIDs, as the client sees them
	msg              *wrapperspb.BytesValue
	count            counter
}

func quietLogger(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }

func openProtoRemote() (*endpoints, error) {
	p := &protoRemote{msg: wrapperspb.Bytes(bytes.Repeat([]byte{0xab}, payloadSize))}
	// Shutdown sends a few dead letters; a short throttle interval lets the
	// throttle's timer goroutine end soon after, not a second later.
	opts := []actor.ConfigOption{actor.WithLoggerFactory(quietLogger), actor.WithDeadLetterThrottleInterval(10 * time.Millisecond)}
	p.server = actor.NewActorSystem(opts...)
	p.client = actor.NewActorSystem(opts...)
	// Port 0: the remote listens on a free port and advertises it.
	p.serverR = remote.NewRemote(p.server, remote.Configure("127.0.0.1", 0))
	p.clientR = remote.NewRemote(p.client, remote.Configure("127.0.0.1", 0))
	p.serverR.Start()
	p.clientR.Start()

	echo := actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(*wrapperspb.BytesValue); ok {
			ctx.Respond(m)
		}
	})
	sink := actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*wrapperspb.BytesValue); ok {
			p.count.add(1)
		}
	})
	var err error
	if _, err = p.server.Root.SpawnNamed(echo, "echo"); err == nil {
		_, err = p.server.Root.SpawnNamed(sink, "sink")
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("protoactor-grpc: spawn: %w", err)
	}
	addr := p.server.Address()
	p.echo, p.sink = actor.NewPID(addr, "echo"), actor.NewPID(addr, "sink")
	return &endpoints{pinger: p, sender: p, close: p.close}, nil
}

// RoundTrip is one RequestFuture to the remote echo actor.
func (p *protoRemote) RoundTrip() error {
	res, err := p.client.Root.RequestFuture(p.echo, p.msg, requestTimeout).Result()
	if err != nil {
		return err
	}
	m, ok := res.(*wrapperspb.BytesValue)
	if !ok || !bytes.Equal(m.Value, p.msg.Value) {
		return fmt.Errorf("protoactor-grpc: unexpected response %T", res)
	}
	return nil
}

// Send is one Send to the remote counting actor.
func (p *protoRemote) Send() error {
	p.client.Root.Send(p.sink, p.msg)
	return nil
}

// WaitReceived waits for the counting actor.
func (p *protoRemote) WaitReceived(total int, timeout time.Duration) error {
	return p.count.wait(total, timeout)
}

func (p *protoRemote) close() error {
	// Graceful: stop the endpoints, then the gRPC servers.
	p.clientR.Shutdown(true)
	p.serverR.Shutdown(true)
	p.client.Shutdown()
	p.server.Shutdown()
	if !p.client.IsStopped() || !p.server.IsStopped() {
		return errors.New("protoactor-grpc: actor systems did not stop")
	}
	return nil
}
