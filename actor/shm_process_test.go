package actor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
)

// TestHelperShmNode is not a test: it is the body of the node processes of
// the shared-memory tests, whose host id comes from TF_TEST_SHM_HOST ("":
// the kernel's boot id).
func TestHelperShmNode(t *testing.T) {
	path, name := os.Getenv("TF_TEST_SHM_CONFIG"), os.Getenv("TF_TEST_SHM_NODE")
	if path == "" {
		t.Skip("runs only as a child process")
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	node, err := actor.NewNode(cfg, name, testLogger(), actor.WithSharedMemory(shm.Config{HostID: os.Getenv("TF_TEST_SHM_HOST")}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	spawnTestActors(node)
	serveChild(node)
}

// shmCluster runs node0 here (with host id host, "" for the boot id) and
// node1 in a child process (with childHost), and waits until they are up.
func shmCluster(t *testing.T, host, childHost string) (*actor.Node, *childNode) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	cfg, err := config.LocalConfig("shmproc", 2)
	if err != nil {
		t.Fatal(err)
	}
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperShmNode$", "-test.v=false")
	cmd.Env = append(os.Environ(), "TF_TEST_SHM_CONFIG="+path, "TF_TEST_SHM_NODE=node1", "TF_TEST_SHM_HOST="+childHost)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child := &childNode{cmd: cmd, done: make(chan error, 1)}
	go func() { child.done <- cmd.Wait() }()
	t.Cleanup(func() { child.kill(syscall.SIGKILL) })
	local, err := actor.NewNode(cfg, "node0", actor.WithSharedMemory(shm.Config{HostID: host}))
	if err != nil {
		t.Fatal(err)
	}
	if err := local.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := local.WaitPeer(ctx, "node1"); err != nil {
		t.Fatal(err)
	}
	return local, child
}

// requests checks that n round trips to node1's echo actor succeed.
func requests(t *testing.T, a *actor.Node, n int) {
	t.Helper()
	pid := a.PID("node1", "echo")
	for i := range n {
		res, err := a.Root().RequestFuture(pid, &Ping{N: i}, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if p := res.(*Pong); p.N != i || p.From != "node1" {
			t.Fatalf("request %d: got %+v", i, p)
		}
	}
}

// TestProcessesSharedMemory: two processes of one host pick shared memory
// for their control connection and exchange messages over it; when the
// child dies, this node learns it from the connection's end (the liveness
// socket), not from the failure timeout.
func TestProcessesSharedMemory(t *testing.T) {
	a, child := shmCluster(t, "", "")
	if got := a.PeerTransport("node1"); got != shm.TransportShm {
		t.Fatalf("control connection over %q, want %q", got, shm.TransportShm)
	}
	requests(t, a, 200)

	downs := make(chan *cluster.NodeDown, 4)
	sub := a.System().EventStream.Subscribe(func(ev any) {
		if d, ok := ev.(*cluster.NodeDown); ok {
			downs <- d
		}
	})
	defer a.System().EventStream.Unsubscribe(sub)
	child.kill(syscall.SIGKILL)
	select {
	case d := <-downs:
		if d.Node != "node1" || strings.Contains(d.Reason, "silent") {
			t.Fatalf("NodeDown %+v: want node1, for its connection's end", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no NodeDown after the child was killed")
	}
}

// TestProcessesOtherHostsStayOnTCP: processes that report different host
// ids (as on two hosts) keep TCP, and talk.
func TestProcessesOtherHostsStayOnTCP(t *testing.T) {
	a, _ := shmCluster(t, "host a", "host b")
	if got := a.PeerTransport("node1"); got != "tcp" {
		t.Fatalf("control connection over %q, want tcp", got)
	}
	requests(t, a, 50)
}
