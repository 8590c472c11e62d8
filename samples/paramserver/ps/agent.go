package ps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
)

// Exit tells an agent that the driver has everything it needs: the node may
// stop. It is not answered.
type Exit struct{}

func init() { actor.MustRegisterMessage("paramserver.Exit", &Exit{}) }

// ErrDriverDown is reported by Agent.Err when the driver's node went down
// before training finished.
var ErrDriverDown = errors.New("ps: the driver's node went down")

// Agent runs, on one node, the shards and workers a driver's Setup places
// there. Every node of a training cluster runs one, the driver's included.
type Agent struct {
	node    *actor.Node
	devices []memory.Device

	once sync.Once
	done chan struct{}
	err  error

	// owned by the agent actor
	pids     []*pa.PID
	driver   *pa.PID
	finished bool
}

// Serve spawns the node's agent. Call it before node.Start, so that the
// agent exists when the driver's Setup arrives. Shards and then workers on
// this node use the node's devices from cc in turn (a worker on a GPU
// computes its gradient there).
func Serve(node *actor.Node, cc *config.Config) (*Agent, error) {
	nc, ok := cc.Node(node.Name())
	if !ok {
		return nil, fmt.Errorf("ps: node %q is not in the cluster config", node.Name())
	}
	a := &Agent{node: node, devices: slices.Clone(nc.Devices), done: make(chan struct{})}
	if len(a.devices) == 0 {
		a.devices = []memory.Device{node.Device()}
	}
	if _, err := node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return a }), agentID); err != nil {
		return nil, fmt.Errorf("ps: spawn agent: %w", err)
	}
	return a, nil
}

// Done is closed when the driver says training is over (or its node went
// down): the node may stop.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Err returns why the agent ended early (ErrDriverDown), or nil.
func (a *Agent) Err() error {
	select {
	case <-a.done:
		return a.err
	default:
		return nil
	}
}

func (a *Agent) end(err error) {
	a.once.Do(func() {
		a.err = err
		close(a.done)
	})
}

// Receive implements protoactor's Actor.
func (a *Agent) Receive(c pa.Context) {
	switch m := c.Message().(type) {
	case *Setup:
		c.Respond(a.setup(c, m))
	case *Finish:
		c.Respond(a.finish())
	case *Exit:
		a.end(nil)
	case *pa.Terminated:
		if a.driver != nil && m.Who.Equal(a.driver) {
			if a.finished {
				a.end(nil) // the driver ended after collecting the results
				return
			}
			a.stopAll()
			a.end(ErrDriverDown)
		}
	case *pa.Stopped:
		a.stopAll()
		a.end(nil)
	}
}

func (a *Agent) setup(c pa.Context, m *Setup) *Ready {
	if a.pids != nil || a.finished {
		return &Ready{Err: "ps: node already set up"}
	}
	cfg := m.Config
	if err := cfg.Validate(); err != nil {
		return &Ready{Err: err.Error()}
	}
	if len(m.Layout.ShardNodes) != cfg.Shards || len(m.Layout.WorkerNodes) != cfg.Workers {
		return &Ready{Err: fmt.Sprintf("ps: layout places %d shards and %d workers, config has %d and %d",
			len(m.Layout.ShardNodes), len(m.Layout.WorkerNodes), cfg.Shards, cfg.Workers)}
	}
	self := a.node.Name()
	// Workers here watch the shards, and shards answer workers, as soon as
	// training starts: this node must see every node of the layout up
	// first (the driver saw them, but this node connects on its own).
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	for _, n := range append(slices.Clone(m.Layout.ShardNodes), m.Layout.WorkerNodes...) {
		if n != self {
			if err := a.node.WaitPeer(ctx, n); err != nil {
				return &Ready{Err: fmt.Sprintf("ps: %s waiting for node %s: %v", self, n, err)}
			}
		}
	}
	ready := &Ready{}
	fail := func(err error) *Ready {
		a.stopAll()
		return &Ready{Err: err.Error()}
	}
	local := 0
	for i, n := range m.Layout.ShardNodes {
		if n != self {
			continue
		}
		dev := a.devices[local%len(a.devices)]
		local++
		s, err := newShard(a.node, cfg, i, dev)
		if err != nil {
			return fail(err)
		}
		pid, err := a.node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return s }, a.node.WithDevice(dev)), shardID(i))
		if err != nil {
			s.free()
			return fail(fmt.Errorf("ps: spawn shard %d: %w", i, err))
		}
		a.pids = append(a.pids, pid)
		ready.Shards = append(ready.Shards, ShardPlace{Shard: i, Node: self, Device: dev.String()})
	}
	shards := make([]*pa.PID, cfg.Shards)
	for i, n := range m.Layout.ShardNodes {
		shards[i] = a.node.PID(n, shardID(i))
	}
	driver := a.node.PID(m.DriverNode, driverID)
	for j, n := range m.Layout.WorkerNodes {
		if n != self {
			continue
		}
		dev := a.devices[local%len(a.devices)]
		local++
		wk, err := newWorker(a.node, cfg, j, dev, shards, driver)
		if err != nil {
			return fail(err)
		}
		pid, err := a.node.Root().SpawnNamed(pa.PropsFromProducer(func() pa.Actor { return wk },
			a.node.WithDevice(dev), a.node.WithDestinations(wk.destination)), workerID(j))
		if err != nil {
			wk.free()
			return fail(fmt.Errorf("ps: spawn worker %d: %w", j, err))
		}
		a.pids = append(a.pids, pid)
	}
	if a.pids == nil {
		a.pids = []*pa.PID{} // set up, with nothing to run here
	}
	if m.DriverNode != self {
		a.driver = driver
		c.Watch(driver)
	}
	return ready
}

func (a *Agent) finish() *Finished {
	a.stopAll()
	a.finished = true
	st := a.node.Stats()
	f := &Finished{Node: a.node.Name(), MessagesSent: st.MessagesSent, Channels: map[string]ChannelBytes{}}
	for name, ch := range st.Channels {
		f.Channels[name] = ChannelBytes{Transfers: ch.Transfers, Bytes: ch.Bytes}
	}
	return f
}

// stopAll stops the shards and workers of this node and waits until they
// freed their tensors.
func (a *Agent) stopAll() {
	for _, pid := range a.pids {
		_ = a.node.Root().StopFuture(pid).Wait()
	}
	a.pids = nil
}

// stopTimeout bounds how long Setup and Finish may take on one node.
const stopTimeout = 2 * time.Minute
