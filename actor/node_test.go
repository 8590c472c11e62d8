package actor_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/config"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor-go's ActorSystem starts process-wide goroutines that
		// outlive Shutdown.
		// protoactor-go's dead-letter log throttle runs a timer goroutine
		// that outlives ActorSystem.Shutdown by up to its interval.
		goleak.IgnoreAnyFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		// memberlist's Shutdown does not wait for a probe in flight, which
		// ends at its ack timer, within the probe interval (gossip soak).
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

type Ping struct {
	N    int
	Text string
}

type Pong struct {
	N    int
	From string
}

func init() {
	actor.MustRegisterMessage("test.Ping", &Ping{})
	actor.MustRegisterMessage("test.Pong", &Pong{})
}

// startCluster starts n nodes of a loopback cluster in this process and
// waits until every node sees every other.
func startCluster(t *testing.T, n int) (*config.Config, []*actor.Node) {
	return startClusterB(t, n)
}

func startClusterB(t testing.TB, n int) (*config.Config, []*actor.Node) {
	t.Helper()
	cfg, err := config.LocalConfig("test", n)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, startNodes(t, cfg)
}

// startNodes starts every node of cfg in this process (stopped at the
// test's end) and waits until each sees every other up.
func startNodes(t testing.TB, cfg *config.Config, opts ...actor.Option) []*actor.Node {
	t.Helper()
	n := len(cfg.Nodes)
	nodes := make([]*actor.Node, n)
	for i := range nodes {
		node, err := actor.NewNode(cfg, cfg.Nodes[i].Name, append([]actor.Option{testLogger()}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = node
		t.Cleanup(func() { _ = node.Stop() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				if err := a.WaitPeer(ctx, b.Name()); err != nil {
					t.Fatalf("%s waiting for %s: %v", a.Name(), b.Name(), err)
				}
			}
		}
	}
	return nodes
}

// testLogger logs to stderr when TF_TEST_LOG is set.
func testLogger() actor.Option {
	if os.Getenv("TF_TEST_LOG") == "" {
		return actor.WithLogger(zap.NewNop())
	}
	l, _ := zap.NewDevelopment()
	return actor.WithLogger(l)
}

func echoProps(name string) *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Ping); ok {
			c.Respond(&Pong{N: p.N, From: name})
		}
	})
}

func TestRequestResponse(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	if _, err := b.Root().SpawnNamed(echoProps(b.Name()), "echo"); err != nil {
		t.Fatal(err)
	}
	pid := a.PID(b.Name(), "echo")
	for i := range 100 {
		res, err := a.Root().RequestFuture(pid, &Ping{N: i}, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		pong, ok := res.(*Pong)
		if !ok || pong.N != i || pong.From != b.Name() {
			t.Fatalf("request %d: got %#v", i, res)
		}
	}
}

func TestRequestToMissingActorFailsAtOnce(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	start := time.Now()
	_, err := a.Root().RequestFuture(a.PID(b.Name(), "nobody"), &Ping{}, 10*time.Second).Result()
	if !errors.Is(err, pa.ErrDeadLetter) {
		t.Fatalf("err = %v, want ErrDeadLetter", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v: want an error at once, not a timeout", d)
	}
}
