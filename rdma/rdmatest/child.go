package rdmatest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
)

// ChildOwnerEnv is the environment variable that makes RunChildOwner act as
// the owner process (its value is the owner's configuration, in JSON).
const ChildOwnerEnv = "TENSORFERRY_RDMATEST_OWNER"

// childConfig is what the parent tells the owner process.
type childConfig struct {
	OwnerDevice memory.Device `json:"owner_device"`
}

// childRequest is one line from the parent to the owner process.
type childRequest struct {
	Op       string `json:"op"` // "export", "release", "check" or "control"
	Seed     uint64 `json:"seed,omitempty"`
	Size     int    `json:"size,omitempty"`
	ExportID uint64 `json:"export_id,omitempty"`
	Lease    uint64 `json:"lease,omitempty"`
	Channel  string `json:"channel,omitempty"`
	Req      []byte `json:"req,omitempty"`
}

// childReply is the owner process's answer to one request; its first line
// carries only Addr, the data listener.
type childReply struct {
	Addr string             `json:"addr,omitempty"`
	Desc *tensor.Descriptor `json:"desc,omitempty"`
	Resp []byte             `json:"resp,omitempty"`
	Err  string             `json:"err,omitempty"`
}

// ChildOwner runs the owner in another process: the test binary re-executes
// itself with -test.run=^TestHelperOwner$ and ChildOwnerEnv set. The test
// package must therefore contain
//
//	func TestHelperOwner(t *testing.T) { rdmatest.RunChildOwner(t, newChannel) }
//
// The owner process makes its Store and channel (newChannel) on ownerDev and
// listens on TCP loopback for data connections; the parent's fetcher channel
// (newChannel too) allocates on fetchDev. The parent drives the owner over
// a pair of pipes, one JSON line per request: export (seed and size; the
// owner produces the data with Fill), release, check, and control (the
// fetcher's Env.Control). Kill sends SIGKILL. GPU tests use it to run the
// two ends on different GPUs, in different processes (the owner on cuda:0,
// the fetcher on cuda:1).
func ChildOwner(t testing.TB, newChannel func(env *rdma.Env) (rdma.Channel, error), ownerDev, fetchDev memory.Device) *Pair {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(childConfig{OwnerDevice: ownerDev})
	if err != nil {
		t.Fatal(err)
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperOwner$", "-test.count=1")
	cmd.Env = append(os.Environ(), ChildOwnerEnv+"="+string(cfg))
	cmd.ExtraFiles = []*os.File{reqR, repW} // fd 3 and 4 in the child
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the owner process: %v", err)
	}
	_ = reqR.Close()
	_ = repW.Close()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var (
		mu     sync.Mutex
		lines  = bufio.NewReader(repR)
		killed bool
	)
	read := func(timeout time.Duration) (childReply, error) {
		_ = repR.SetReadDeadline(time.Now().Add(timeout))
		line, err := lines.ReadBytes('\n')
		if err != nil {
			return childReply{}, fmt.Errorf("rdmatest: owner process: %w", err)
		}
		var rep childReply
		if err := json.Unmarshal(line, &rep); err != nil {
			return childReply{}, fmt.Errorf("rdmatest: owner process reply %q: %w", line, err)
		}
		return rep, nil
	}
	call := func(req childRequest) (childReply, error) {
		mu.Lock()
		defer mu.Unlock()
		if killed {
			return childReply{}, fmt.Errorf("rdmatest: owner process killed: %w", rdma.ErrPeerDown)
		}
		b, err := json.Marshal(req)
		if err != nil {
			return childReply{}, err
		}
		if _, err := reqW.Write(append(b, '\n')); err != nil {
			return childReply{}, fmt.Errorf("rdmatest: owner process: %w", err)
		}
		rep, err := read(5 * time.Minute)
		if err == nil && rep.Err != "" {
			err = errors.New(rep.Err)
		}
		return rep, err
	}
	first, err := read(2 * time.Minute)
	if err != nil || first.Addr == "" {
		_ = cmd.Process.Kill()
		<-waited
		t.Fatalf("owner process did not start: %v", err)
	}
	fetchEnv := &rdma.Env{
		Node: FetcherNode, Incarnation: 1, Store: tensor.NewStore(FetcherNode, 1),
		Dial: func(ctx context.Context, node, channel string) (net.Conn, error) {
			if node != OwnerNode {
				return nil, fmt.Errorf("rdmatest: no node %q", node)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", first.Addr)
		},
		Control: func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
			if node != OwnerNode {
				return nil, fmt.Errorf("rdmatest: no node %q", node)
			}
			rep, err := call(childRequest{Op: "control", Channel: channel, Req: req})
			return rep.Resp, err
		},
		Staging: TestStaging, Verbs: TestVerbs,
	}
	fc, err := newChannel(fetchEnv)
	if err != nil {
		_ = cmd.Process.Kill()
		<-waited
		t.Fatalf("fetcher channel: %v", err)
	}
	kill := func() {
		mu.Lock()
		defer mu.Unlock()
		if !killed {
			killed = true
			_ = cmd.Process.Kill()
		}
	}
	t.Cleanup(func() {
		if err := fc.Close(); err != nil {
			t.Errorf("closing the fetcher channel: %v", err)
		}
		fetchEnv.Store.Close()
		_ = reqW.Close() // the owner process ends on EOF
		select {
		case err := <-waited:
			mu.Lock()
			k := killed
			mu.Unlock()
			if err != nil && !k {
				t.Errorf("owner process: %v (its output is above)", err)
			}
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-waited
			t.Error("owner process did not exit within a minute")
		}
		_ = repR.Close()
	})
	return &Pair{
		Fetcher:     fc,
		FetchDevice: fetchDev,
		OwnerDevice: ownerDev,
		ChunkSize:   TestChunkSize,
		Export: func(t testing.TB, seed uint64, size int) *tensor.Descriptor {
			t.Helper()
			rep, err := call(childRequest{Op: "export", Seed: seed, Size: size})
			if err != nil {
				t.Fatalf("export of %d bytes: %v", size, err)
			}
			if err := rep.Desc.Validate(); err != nil {
				t.Fatalf("export of %d bytes: %v", size, err)
			}
			return rep.Desc
		},
		Release: func(_ testing.TB, d *tensor.Descriptor) error {
			_, err := call(childRequest{Op: "release", ExportID: d.ExportID, Lease: d.Lease})
			return err
		},
		Kill: kill,
		Check: func() error {
			mu.Lock()
			k := killed
			mu.Unlock()
			if k {
				return nil // the process and everything it held are gone
			}
			_, err := call(childRequest{Op: "check"})
			return err
		},
	}
}

// RunChildOwner is the owner process's side of ChildOwner. Called from
// TestHelperOwner, it skips unless ChildOwnerEnv is set; otherwise it serves
// the parent's requests until the parent closes its pipe, then closes the
// channel and fails the test if an export is still lent.
func RunChildOwner(t *testing.T, newChannel func(env *rdma.Env) (rdma.Channel, error)) {
	raw := os.Getenv(ChildOwnerEnv)
	if raw == "" {
		t.Skip("the owner process of rdmatest.ChildOwner; runs only when started by it")
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%s: %v", ChildOwnerEnv, err)
	}
	reqs, reps := os.NewFile(3, "requests"), os.NewFile(4, "replies")
	defer reps.Close()
	defer reqs.Close()
	env := &rdma.Env{
		Node: OwnerNode, Incarnation: 1, Store: tensor.NewStore(OwnerNode, 1),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("rdmatest: the owner does not dial")
		},
		Control: func(context.Context, string, string, []byte) ([]byte, error) {
			return nil, errors.New("rdmatest: the owner process cannot reach the fetcher's control handler")
		},
		Staging: TestStaging, Verbs: TestVerbs,
	}
	ch, err := newChannel(env)
	if err != nil {
		t.Fatalf("owner channel: %v", err)
	}
	o := &owner{dev: cfg.OwnerDevice, ch: ch, store: env.Store, peer: FetcherNode}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			cs, ok := ch.(rdma.ConnServer)
			if !ok {
				_ = conn.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cs.ServeConn(conn, FetcherNode)
			}()
		}
	}()
	defer func() {
		_ = ln.Close()
		_ = ch.Close()
		wg.Wait()
		o.close(t)
	}()
	enc := json.NewEncoder(reps)
	if err := enc.Encode(childReply{Addr: ln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	in := bufio.NewScanner(reqs)
	in.Buffer(nil, 1<<20)
	for in.Scan() {
		var req childRequest
		var rep childReply
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			t.Fatalf("request %q: %v", in.Bytes(), err)
		}
		switch req.Op {
		case "export":
			rep.Desc, err = o.export(req.Seed, req.Size)
		case "release":
			err = o.store.Release(req.ExportID, req.Lease)
		case "check":
			err = o.check()
		case "control":
			h, ok := ch.(rdma.ControlHandler)
			if !ok || ch.Name() != req.Channel {
				err = fmt.Errorf("rdmatest: the owner has no control handler for %q", req.Channel)
				break
			}
			rep.Resp, err = h.HandleControl(context.Background(), FetcherNode, req.Req)
		default:
			err = fmt.Errorf("rdmatest: unknown request %q", req.Op)
		}
		if err != nil {
			rep.Err = err.Error()
		}
		if err := enc.Encode(rep); err != nil {
			t.Fatalf("reply: %v", err)
		}
	}
	if err := in.Err(); err != nil {
		t.Fatalf("requests: %v", err)
	}
}
