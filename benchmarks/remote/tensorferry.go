package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
)

func init() {
	tfactor.MustRegisterMessage("bench.remote.Msg", &tfMsg{})
	extraPaths = append(extraPaths,
		path{name: "tensorferry", open: func() (*endpoints, error) { return openTensorferry(true, false) }},
		path{name: "tensorferry-future", open: func() (*endpoints, error) { return openTensorferry(false, false) }},
		path{name: "tensorferry-poller", open: func() (*endpoints, error) {
			return openTensorferryWith(tfRequest|tfInline, false, func(cfg *config.Config) { cfg.Transport.ReadSpinDetach = config.SwitchOff })
		}},
		// The two halves of tensorferry-future, each with the other half
		// as tensorferry has it: where its extra time goes, the client's
		// protoactor future or the server's default mailbox.
		// tensorferry-future with no timeout (-1): protoactor's future
		// then arms no timer (a timer added to an empty timer heap may
		// wake a thread to wait for it).
		path{name: "tensorferry-future-notimer", rttOnly: true, open: func() (*endpoints, error) {
			e, err := openTensorferryRTT(0)
			if e != nil {
				e.pinger.(*tensorferryPath).timeout = -1
			}
			return e, err
		}},
		path{name: "tensorferry-future-inline", rttOnly: true, open: func() (*endpoints, error) { return openTensorferryRTT(tfInline) }},
		path{name: "tensorferry-request-mailbox", rttOnly: true, open: func() (*endpoints, error) { return openTensorferryRTT(tfRequest) }})
	// One path per fast-path switch, "tensorferry" with that switch off:
	// interleaved with "tensorferry", what each fast path buys on this host.
	for _, off := range []struct {
		name string
		set  func(*config.TransportConfig)
	}{
		{"caller-reads", func(t *config.TransportConfig) { t.CallerReads = config.SwitchOff }},
		{"burst-decode", func(t *config.TransportConfig) { t.BurstDecode = config.SwitchOff }},
		{"inline-delivery", func(t *config.TransportConfig) { t.InlineDelivery = config.SwitchOff }},
		{"direct-write", func(t *config.TransportConfig) { t.DirectWrite = config.SwitchOff }},
		{"read-spin", func(t *config.TransportConfig) { t.ReadSpin = config.ReadSpinOff }},
	} {
		extraPaths = append(extraPaths, path{name: "tensorferry-no-" + off.name, open: func() (*endpoints, error) {
			return openTensorferryWith(tfRequest|tfInline, false, func(cfg *config.Config) { off.set(&cfg.Transport) })
		}})
	}
}

// openTensorferryRTT opens a tensorferry path for its round trips only.
func openTensorferryRTT(how int) (*endpoints, error) {
	e, err := openTensorferryWith(how, false, nil)
	if e != nil {
		e.sender = nil
	}
	return e, err
}

// How a tensorferry path's client asks and its server answers.
const (
	tfRequest = 1 << iota // the client waits with Node.RequestTimeout, not RequestFuture
	tfInline              // the server's actors have inline delivery, not a default mailbox
)

// tensorferryPath is two tensorferry nodes of one loopback cluster in this
// process, each with its own listeners, talking over tensorferry's own wire
// protocol. The "tensorferry" path uses what the runtime offers for
// request/response services: the server's actors have inline delivery
// (Node.WithInlineDelivery) and the client waits with Node.Request. The
// "tensorferry-future" path is protoactor-go's API unchanged over
// tensorferry's transport: default mailboxes, RequestFuture.
// "tensorferry-future-inline" (RequestFuture to an actor with inline
// delivery) and "tensorferry-request-mailbox" (Node.Request to an actor
// with a default mailbox) each take one half of "tensorferry-future".
// "tensorferry-poller" is "tensorferry" with its spinning TCP readers left
// in the Go runtime's network poller (transport.read_spin_detach: off):
// interleaved with "tensorferry", what taking them out buys (nothing where
// the read spin is off, below 8 processors).
type tensorferryPath struct {
	how            int           // tfRequest, tfInline
	timeout        time.Duration // of each request: requestTimeout unless set
	shm            bool          // control connection over shared memory (shm.go)
	client, server *tfactor.Node
	echo, sink     *pa.PID
	msg            *tfMsg
	count          counter
}

// readSpin is --read-spin: the read spin of the tensorferry paths' control
// connections, over TCP and shared memory (config transport.read_spin).
var readSpin = flag.Duration("read-spin", 0, "read spin of the tensorferry paths' control connections, TCP and shared memory (0: the node's default, wire.DefaultReadSpin with at least 8 processors and CPUs or TENSORFERRY_FASTPATHS=on, none below; negative: never)")

// withReadSpin applies --read-spin to cfg.
func withReadSpin(cfg *config.Config) {
	switch {
	case *readSpin < 0:
		cfg.Transport.ReadSpin = config.ReadSpinOff
	case *readSpin > 0:
		cfg.Transport.ReadSpin = *readSpin
	}
}

// openTensorferry opens "tensorferry" (native: Node.Request, inline
// delivery) or "tensorferry-future" (RequestFuture, default mailboxes).
func openTensorferry(native, sharedMemory bool) (*endpoints, error) {
	if native {
		return openTensorferryWith(tfRequest|tfInline, sharedMemory, nil)
	}
	return openTensorferryWith(0, sharedMemory, nil)
}

// openTensorferryWith opens a tensorferry path whose client and server
// work as how says (tfRequest, tfInline), with tune, when not nil, applied
// to the cluster's config last.
func openTensorferryWith(how int, sharedMemory bool, tune func(*config.Config)) (*endpoints, error) {
	cfg, err := config.LocalConfig("bench", 2)
	if err != nil {
		return nil, err
	}
	withReadSpin(cfg)
	if tune != nil {
		tune(cfg)
	}
	p := &tensorferryPath{how: how, shm: sharedMemory, timeout: requestTimeout, msg: &tfMsg{Payload: bytes.Repeat([]byte{0xab}, payloadSize)}}
	quiet := tfactor.WithSystemConfig(pa.WithLoggerFactory(quietLogger), pa.WithDeadLetterThrottleInterval(10*time.Millisecond))
	transport := tfactor.WithSharedMemory(shmConfig(sharedMemory))
	if p.server, err = tfactor.NewNode(cfg, cfg.Nodes[1].Name, quiet, transport); err != nil {
		return nil, err
	}
	if p.client, err = tfactor.NewNode(cfg, cfg.Nodes[0].Name, quiet, transport); err != nil {
		return nil, err
	}
	if err := p.server.Start(); err != nil {
		return nil, err
	}
	if err := p.client.Start(); err != nil {
		_ = p.server.Stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.client.WaitPeer(ctx, p.server.Name()); err != nil {
		return nil, errors.Join(err, p.close())
	}
	var opts []pa.PropsOption
	if how&tfInline != 0 {
		opts = append(opts, p.server.WithInlineDelivery())
	}
	echo := pa.PropsFromFunc(func(ctx pa.Context) {
		if m, ok := ctx.Message().(*tfMsg); ok {
			ctx.Respond(m)
		}
	}, opts...)
	sink := pa.PropsFromFunc(func(ctx pa.Context) {
		if _, ok := ctx.Message().(*tfMsg); ok {
			p.count.add(1)
		}
	}, opts...)
	if _, err = p.server.Root().SpawnNamed(echo, "echo"); err == nil {
		_, err = p.server.Root().SpawnNamed(sink, "sink")
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tensorferry: spawn: %w", err), p.close())
	}
	p.echo = p.client.PID(p.server.Name(), "echo")
	p.sink = p.client.PID(p.server.Name(), "sink")
	return &endpoints{pinger: p, sender: p, close: p.close}, nil
}

// RoundTrip is one request to the remote echo actor, each bounded by
// requestTimeout as protoactor's requests are (RequestTimeout, as
// RequestFuture with a timeout).
func (p *tensorferryPath) RoundTrip() error {
	var res any
	var err error
	if p.how&tfRequest != 0 {
		res, err = p.client.RequestTimeout(p.echo, p.msg, requestTimeout)
	} else {
		res, err = p.client.Root().RequestFuture(p.echo, p.msg, p.timeout).Result()
	}
	if err != nil {
		return err
	}
	m, ok := res.(*tfMsg)
	if !ok || !bytes.Equal(m.Payload, p.msg.Payload) {
		return fmt.Errorf("tensorferry: unexpected response %T", res)
	}
	return nil
}

func (p *tensorferryPath) name() string {
	if p.shm {
		return "tensorferry-shm"
	}
	switch p.how {
	case tfRequest | tfInline:
		return "tensorferry"
	case tfInline:
		return "tensorferry-future-inline"
	case tfRequest:
		return "tensorferry-request-mailbox"
	}
	return "tensorferry-future"
}

// Send sends one message to the remote sink.
func (p *tensorferryPath) Send() error {
	p.client.Root().Send(p.sink, p.msg)
	return nil
}

// WaitReceived waits until the sink counted total messages.
func (p *tensorferryPath) WaitReceived(total int, timeout time.Duration) error {
	return p.count.wait(total, timeout)
}

func (p *tensorferryPath) close() error {
	if p.server != nil {
		s := p.server.Stats()
		fmt.Fprintf(os.Stderr, "remote: %s: the server received %d messages, %d of them in %d batch frames (%.0f a frame), %d handled inline\n",
			p.name(), s.MessagesReceived, s.MessagesBatched, s.BatchFrames, float64(s.MessagesBatched)/float64(max(s.BatchFrames, 1)), s.MessagesInline)
	}
	var errs []error
	if p.client != nil {
		errs = append(errs, p.client.Stop())
	}
	if p.server != nil {
		errs = append(errs, p.server.Stop())
	}
	return errors.Join(errs...)
}
