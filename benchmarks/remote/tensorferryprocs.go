package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	tfactor "github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
)

// The two-process paths: the tensorferry path's server node runs in a
// child process of this program (the layout of one process per GPU), its
// control connection to the client node on shared memory
// (tensorferry-procs-shm) or on TCP (tensorferry-procs-tcp), in the same
// run.

// Environment of the child process.
const (
	childConfigEnv = "TF_REMOTE_CHILD_CONFIG" // the cluster config file; set: this process is the child
	childShmEnv    = "TF_REMOTE_CHILD_SHM"    // "1": shared memory on
	childSpinEnv   = "TF_REMOTE_CHILD_SPIN"   // --shm-spin, as a duration
)

// countQuery asks the child's sink how many messages it counted; the sink
// answers with a countReply after every message sent before the query.
type countQuery struct{}

type countReply struct{ N int }

// init runs after tensorferry.go's (files initialize in name order), so
// the child has every message type registered when it starts.
func init() {
	tfactor.MustRegisterMessage("bench.remote.CountQuery", &countQuery{})
	tfactor.MustRegisterMessage("bench.remote.CountReply", &countReply{})
	if path := os.Getenv(childConfigEnv); path != "" {
		os.Exit(runChild(path))
	}
	extraPaths = append(extraPaths,
		path{name: "tensorferry-procs-tcp", open: func() (*endpoints, error) { return openProcs(false) }},
		path{name: "tensorferry-procs-shm", open: func() (*endpoints, error) { return openProcs(true) }})
}

// runChild runs the server node until its standard input closes.
func runChild(path string) int {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		return 2
	}
	if d, err := time.ParseDuration(os.Getenv(childSpinEnv)); err == nil {
		*shmSpin = d
	}
	quiet := tfactor.WithSystemConfig(pa.WithLoggerFactory(quietLogger))
	node, err := tfactor.NewNode(cfg, cfg.Nodes[1].Name, quiet, tfactor.WithSharedMemory(shmConfig(os.Getenv(childShmEnv) == "1")))
	if err == nil {
		err = node.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		return 2
	}
	echo := pa.PropsFromFunc(func(ctx pa.Context) {
		if m, ok := ctx.Message().(*tfMsg); ok {
			ctx.Respond(m)
		}
	}, node.WithInlineDelivery())
	n := 0
	sink := pa.PropsFromFunc(func(ctx pa.Context) {
		switch ctx.Message().(type) {
		case *tfMsg:
			n++
		case *countQuery:
			ctx.Respond(&countReply{N: n})
		}
	})
	if _, err = node.Root().SpawnNamed(echo, "echo"); err == nil {
		_, err = node.Root().SpawnNamed(sink, "sink")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote child:", err)
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	_ = node.Stop()
	return 0
}

type procsPath struct {
	client     *tfactor.Node
	child      *exec.Cmd
	stdin      io.WriteCloser
	waited     chan error
	echo, sink *pa.PID
	msg        *tfMsg
}

func openProcs(sharedMemory bool) (*endpoints, error) {
	cfg, err := config.LocalConfig("bench-procs", 2)
	if err != nil {
		return nil, err
	}
	withReadSpin(cfg) // the child reads it from the config file
	dir, err := os.MkdirTemp("", "remote-procs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir) // the child has read the config once it is up
	path, err := cfg.WriteFiles(dir)
	if err != nil {
		return nil, err
	}
	p := &procsPath{msg: &tfMsg{Payload: bytes.Repeat([]byte{0xab}, payloadSize)}, waited: make(chan error, 1)}
	shmOn := "0"
	if sharedMemory {
		shmOn = "1"
	}
	p.child = exec.Command(os.Args[0])
	p.child.Env = append(os.Environ(), childConfigEnv+"="+path, childShmEnv+"="+shmOn, childSpinEnv+"="+shmSpin.String())
	p.child.Stdout, p.child.Stderr = os.Stderr, os.Stderr
	if p.stdin, err = p.child.StdinPipe(); err != nil {
		return nil, err
	}
	if err := p.child.Start(); err != nil {
		return nil, err
	}
	go func() { p.waited <- p.child.Wait() }()
	quiet := tfactor.WithSystemConfig(pa.WithLoggerFactory(quietLogger), pa.WithDeadLetterThrottleInterval(10*time.Millisecond))
	if p.client, err = tfactor.NewNode(cfg, cfg.Nodes[0].Name, quiet, tfactor.WithSharedMemory(shmConfig(sharedMemory))); err == nil {
		err = p.client.Start()
	}
	if err != nil {
		p.client = nil
		return nil, errors.Join(err, p.close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.client.WaitPeer(ctx, cfg.Nodes[1].Name); err != nil {
		return nil, errors.Join(err, p.close())
	}
	want := "tcp"
	if sharedMemory {
		want = "shm"
	}
	if got := p.client.PeerTransport(cfg.Nodes[1].Name); got != want {
		return nil, errors.Join(fmt.Errorf("control connection over %q, want %q", got, want), p.close())
	}
	p.echo = p.client.PID(cfg.Nodes[1].Name, "echo")
	p.sink = p.client.PID(cfg.Nodes[1].Name, "sink")
	// The child's actors may not be spawned yet: wait for an answer.
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := p.client.Request(rctx, p.sink, &countQuery{})
		rcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, errors.Join(fmt.Errorf("the child's actors: %w", err), p.close())
		}
	}
	return &endpoints{pinger: p, sender: p, close: p.close}, nil
}

// RoundTrip is one request to the child's echo actor.
func (p *procsPath) RoundTrip() error {
	res, err := p.client.RequestTimeout(p.echo, p.msg, requestTimeout)
	if err != nil {
		return err
	}
	if m, ok := res.(*tfMsg); !ok || !bytes.Equal(m.Payload, p.msg.Payload) {
		return fmt.Errorf("procs: unexpected response %T", res)
	}
	return nil
}

// Send sends one message to the child's sink.
func (p *procsPath) Send() error {
	p.client.Root().Send(p.sink, p.msg)
	return nil
}

// WaitReceived asks the sink for its count, which it gives after every
// message sent before the question.
func (p *procsPath) WaitReceived(total int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		res, err := p.client.Request(ctx, p.sink, &countQuery{})
		if err != nil {
			return err
		}
		if r, ok := res.(*countReply); ok && r.N >= total {
			return nil
		}
	}
}

func (p *procsPath) close() error {
	var errs []error
	if p.client != nil {
		errs = append(errs, p.client.Stop())
	}
	p.stdin.Close()
	select {
	case err := <-p.waited:
		if err != nil {
			errs = append(errs, fmt.Errorf("child: %w", err))
		}
	case <-time.After(10 * time.Second):
		_ = p.child.Process.Kill()
		errs = append(errs, fmt.Errorf("child: did not stop; killed: %v", <-p.waited))
	}
	return errors.Join(errs...)
}
