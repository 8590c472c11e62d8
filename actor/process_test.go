package actor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
)

// nodeOfChild makes the node of a child process: the config file and node
// name come from the environment variables named; it skips the test with
// why when they are not set (not a child) and exits with 2 on an error.
func nodeOfChild(t *testing.T, configVar, nameVar, why string) *actor.Node {
	t.Helper()
	path, name := os.Getenv(configVar), os.Getenv(nameVar)
	if path == "" {
		t.Skip(why)
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	node, err := actor.NewNode(cfg, name, testLogger())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return node
}

// TestHelperNode is not a test: it is the body of a node process started by
// the tests below (the test binary re-executes itself).
func TestHelperNode(t *testing.T) {
	node := nodeOfChild(t, "TF_TEST_CONFIG", "TF_TEST_NODE", "runs only as a child process")
	// Actors first: a peer may talk to them as soon as the node is up.
	spawnTestActors(node)
	serveChild(node)
}

// serveChild starts the node of a child process and runs it until SIGTERM
// or SIGINT, then stops it and exits.
func serveChild(node *actor.Node) {
	if err := node.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	_ = node.Stop()
	os.Exit(0)
}

// spawnTestActors starts the actors the process tests talk to.
func spawnTestActors(node *actor.Node) {
	_, _ = node.Root().SpawnNamed(echoProps(node.Name()), "echo")
	_, _ = node.Root().SpawnNamed(tensorProps(node), "tensors")
}

type childNode struct {
	cmd  *exec.Cmd
	done chan error
}

func startChild(t *testing.T, cfgPath, name string) *childNode {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperNode$", "-test.v=false")
	cmd.Env = append(os.Environ(), "TF_TEST_CONFIG="+cfgPath, "TF_TEST_NODE="+name)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &childNode{cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() { c.kill(syscall.SIGKILL) })
	return c
}

func (c *childNode) kill(sig syscall.Signal) {
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		c.done <- nil
	case <-time.After(10 * time.Second):
	}
}

// processCluster writes a loopback config of n nodes, runs node0 in this
// process and the others as child processes.
func processCluster(t *testing.T, n int) (string, *actor.Node, []*childNode) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	cfg, err := config.LocalConfig("proc", n)
	if err != nil {
		t.Fatal(err)
	}
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var children []*childNode
	for _, nc := range cfg.Nodes[1:] {
		children = append(children, startChild(t, path, nc.Name))
	}
	local, err := actor.NewNode(cfg, cfg.Nodes[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := local.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	for _, nc := range cfg.Nodes {
		names = append(names, nc.Name)
	}
	for _, nc := range cfg.Nodes[1:] {
		if err := local.WaitPeer(ctx, nc.Name); err != nil {
			t.Fatal(err)
		}
	}
	// Every child sees every node too.
	for _, nc := range cfg.Nodes[1:] {
		res, err := local.Root().RequestFuture(local.PID(nc.Name, "tensors"), &WaitPeers{Nodes: names}, 25*time.Second).Result()
		if err != nil || res.(*Digest).Err != "" {
			t.Fatalf("%s waiting for its peers: %v %v", nc.Name, res, err)
		}
	}
	return path, local, children
}

func TestProcessesRequestAndOrder(t *testing.T) {
	_, a, _ := processCluster(t, 3)
	for _, peer := range []string{"node1", "node2"} {
		pid := a.PID(peer, "echo")
		for i := range 50 {
			res, err := a.Root().RequestFuture(pid, &Ping{N: i}, 5*time.Second).Result()
			if err != nil {
				t.Fatalf("%s request %d: %v", peer, i, err)
			}
			if p := res.(*Pong); p.N != i || p.From != peer {
				t.Fatalf("%s: got %+v", peer, p)
			}
		}
	}
	// One-way order: node1's echo answers each Ping to the sender; a
	// recorder here must see them in order.
	rec := newRecorder()
	sink, err := a.Root().SpawnNamed(rec.props(nil), "sink")
	if err != nil {
		t.Fatal(err)
	}
	fwd := pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Pong); ok {
			c.Send(sink, &Ping{N: p.N})
		}
	})
	relay, err := a.Root().SpawnNamed(fwd, "relay")
	if err != nil {
		t.Fatal(err)
	}
	const count = 1000
	for i := range count {
		a.Root().RequestWithCustomSender(a.PID("node1", "echo"), &Ping{N: i}, relay)
	}
	rec.wait(t, count, 20*time.Second)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, n := range rec.got {
		if n != i {
			t.Fatalf("message %d arrived as %d", i, n)
		}
	}
}

func TestProcessKilledAndRestarted(t *testing.T) {
	path, a, children := processCluster(t, 2)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	remote := a.PID("node1", "echo")
	if _, err := a.Root().RequestFuture(remote, &Ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	oldCaps := a.Topology().Peers["node1"]
	rec := newRecorder()
	if _, err := a.Root().SpawnNamed(rec.props(remote), "watcher"); err != nil {
		t.Fatal(err)
	}
	ups := make(chan *cluster.NodeUp, 4)
	sub := a.System().EventStream.Subscribe(func(ev any) {
		if u, ok := ev.(*cluster.NodeUp); ok {
			ups <- u
		}
	})
	defer a.System().EventStream.Unsubscribe(sub)
	// A request pending when the node dies.
	if _, err := a.Root().SpawnNamed(pa.PropsFromFunc(func(pa.Context) {}), "x"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the watch reach node1
	pending := a.Root().RequestFuture(a.PID("node1", "tensors"), &Hold{}, 60*time.Second)
	time.Sleep(50 * time.Millisecond)

	start := time.Now()
	children[0].kill(syscall.SIGKILL)
	limit := cfg.FailureTimeout + 2*time.Second
	if _, err := pending.Result(); !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("pending request: %v", err)
	}
	rec.wait(t, 1, limit)
	if d := time.Since(start); d > limit {
		t.Fatalf("watcher told after %v, limit %v", d, limit)
	}
	rec.mu.Lock()
	if rec.terms[0].Why != pa.TerminatedReason_AddressTerminated {
		t.Fatalf("Why = %v", rec.terms[0].Why)
	}
	rec.mu.Unlock()

	// Restart: NodeUp with a new incarnation, traffic resumes.
	startChild(t, path, "node1")
	select {
	case u := <-ups:
		if u.Node != "node1" || u.Incarnation == oldCaps.Incarnation {
			t.Fatalf("NodeUp = %+v (old incarnation %d)", u, oldCaps.Incarnation)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no NodeUp after restart")
	}
	res, err := a.Root().RequestFuture(remote, &Ping{N: 7}, 5*time.Second).Result()
	if err != nil || res.(*Pong).N != 7 {
		t.Fatalf("after restart: %v %v", res, err)
	}
}
