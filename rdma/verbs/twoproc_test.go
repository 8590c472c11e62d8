package verbs

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/vmihailenco/msgpack/v5"
)

// The two-process harness: the test binary re-runs itself as the owner
// (childEnv set), listening on TCP loopback for one connection from the
// parent, which carries the verbs control messages and the harness's own
// commands (export, release, check). The bytes move over RDMA between the
// two processes; Kill sends the owner SIGKILL.

const childEnv = "TENSORFERRY_VERBS_OWNER_CHILD"

// harnessMsg is one request or reply on the harness connection.
type harnessMsg struct {
	ID   uint64 `msgpack:"i"`
	Kind string `msgpack:"k"` // ctl, export, release, check
	Body []byte `msgpack:"b"`
	Seed uint64 `msgpack:"s"`
	Size int    `msgpack:"n"`
	Err  string `msgpack:"e"`
	// Code is the control reply's error class for release (tensor errors).
	Desc *tensor.Descriptor `msgpack:"d"`
}

func writeMsg(w io.Writer, mu *sync.Mutex, m *harnessMsg) error {
	b, err := msgpack.Marshal(m)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	var h [4]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(b)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func readMsg(r *bufio.Reader) (*harnessMsg, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > 1<<20 {
		return nil, fmt.Errorf("harness message of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	m := new(harnessMsg)
	return m, msgpack.Unmarshal(b, m)
}

// runChildOwner is the owner process. It exits when the parent hangs up.
func runChildOwner() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	conn, err := ln.Accept()
	_ = ln.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	store := tensor.NewStore(rdmatest.OwnerNode, 1)
	env := &rdma.Env{Node: rdmatest.OwnerNode, Incarnation: 1, Store: store,
		Control: func(context.Context, string, string, []byte) ([]byte, error) {
			return nil, errors.New("the owner sends no control messages")
		}}
	ch, err := New(env)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var (
		wmu     sync.Mutex
		emu     sync.Mutex
		exports []*tensor.Export
		wg      sync.WaitGroup
	)
	handle := func(m *harnessMsg) *harnessMsg {
		out := &harnessMsg{ID: m.ID}
		switch m.Kind {
		case "ctl":
			b, err := ch.HandleControl(context.Background(), rdmatest.FetcherNode, m.Body)
			out.Body = b
			if err != nil {
				out.Err = err.Error()
			}
		case "export":
			t, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{int64(m.Size)})
			if err != nil {
				out.Err = err.Error()
				break
			}
			rdmatest.Fill(m.Seed, t.Host())
			e, d, err := store.Export(t, rdmatest.FetcherNode, 0)
			if err != nil {
				out.Err = err.Error()
				break
			}
			o, err := ch.Offer(context.Background(), e, rdmatest.FetcherNode)
			if err != nil {
				out.Err = err.Error()
				break
			}
			d.Offers = map[string][]byte{rdma.Verbs: o}
			out.Desc = d
			emu.Lock()
			exports = append(exports, e)
			emu.Unlock()
		case "release":
			if err := store.Release(m.Desc.ExportID, m.Desc.Lease); err != nil {
				out.Err = err.Error()
			}
		case "check":
			if n := ch.InFlight(); n != 0 {
				out.Err = fmt.Sprintf("%d reads in flight on the owner", n)
				break
			}
			emu.Lock()
			for _, e := range exports {
				want := 0
				if _, done, err := store.Acquire(1, e.ID, e.Lease); err == nil {
					done()
					want = 1
				}
				if got := e.Tensor.Leases(); got != want {
					out.Err = fmt.Sprintf("export %d: %d leases, want %d", e.ID, got, want)
				}
			}
			emu.Unlock()
		default:
			out.Err = "unknown kind " + m.Kind
		}
		return out
	}
	r := bufio.NewReader(conn)
	for {
		m, err := readMsg(r)
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = writeMsg(conn, &wmu, handle(m))
		}()
	}
	wg.Wait()
	_ = ch.Close()
	store.Close()
	return 0
}

// childOwner is the parent's handle on the owner process.
type childOwner struct {
	cmd  *exec.Cmd
	conn net.Conn
	wmu  sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *harnessMsg
	dead    error
	done    chan struct{}
}

func startChildOwner(t *testing.T) *childOwner {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("owner process: %v", err)
	}
	conn, err := net.Dial("tcp", strings.TrimSpace(line))
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	co := &childOwner{cmd: cmd, conn: conn, pending: map[uint64]chan *harnessMsg{}, done: make(chan struct{})}
	go co.readLoop()
	return co
}

func (co *childOwner) readLoop() {
	defer close(co.done)
	r := bufio.NewReader(co.conn)
	for {
		m, err := readMsg(r)
		if err != nil {
			co.mu.Lock()
			co.dead = fmt.Errorf("owner process gone: %w", err)
			for id, ch := range co.pending {
				delete(co.pending, id)
				close(ch)
			}
			co.mu.Unlock()
			return
		}
		co.mu.Lock()
		ch := co.pending[m.ID]
		delete(co.pending, m.ID)
		co.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

func (co *childOwner) call(ctx context.Context, m *harnessMsg) (*harnessMsg, error) {
	co.mu.Lock()
	if co.dead != nil {
		co.mu.Unlock()
		return nil, co.dead
	}
	co.nextID++
	m.ID = co.nextID
	ch := make(chan *harnessMsg, 1)
	co.pending[m.ID] = ch
	co.mu.Unlock()
	if err := writeMsg(co.conn, &co.wmu, m); err != nil {
		return nil, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			co.mu.Lock()
			defer co.mu.Unlock()
			return nil, co.dead
		}
		if r.Err != "" {
			return r, errors.New(r.Err)
		}
		return r, nil
	case <-ctx.Done():
		co.mu.Lock()
		delete(co.pending, m.ID)
		co.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (co *childOwner) kill() {
	_ = co.cmd.Process.Signal(syscall.SIGKILL)
}

// stop hangs up, waits for the owner to exit (killing it after 10 s) and
// for the reader.
func (co *childOwner) stop(t *testing.T) {
	_ = co.conn.Close()
	exited := make(chan error, 1)
	go func() { exited <- co.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("owner process did not exit; killing it")
		co.kill()
		<-exited
	}
	<-co.done
}

// twoProcessPair is an rdmatest.Pair whose owner is a child process.
func twoProcessPair(t *testing.T) *rdmatest.Pair {
	t.Helper()
	co := startChildOwner(t)
	env := &rdma.Env{Node: rdmatest.FetcherNode, Incarnation: 1, Store: tensor.NewStore(rdmatest.FetcherNode, 1),
		ChunkSize: rdmatest.TestChunkSize, ChunksInFlight: rdmatest.TestChunksInFlight,
		Control: func(ctx context.Context, node, channel string, req []byte) ([]byte, error) {
			if node != rdmatest.OwnerNode || channel != rdma.Verbs {
				return nil, fmt.Errorf("no %s channel on %q", channel, node)
			}
			r, err := co.call(ctx, &harnessMsg{Kind: "ctl", Body: req})
			if err != nil {
				return nil, err
			}
			return r.Body, nil
		}}
	fc, err := New(env)
	if err != nil {
		co.stop(t)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fc.Close(); err != nil {
			t.Errorf("closing the fetcher: %v", err)
		}
		env.Store.Close()
		co.stop(t)
	})
	return &rdmatest.Pair{
		Fetcher: fc, FetchDevice: memory.CPU, OwnerDevice: memory.CPU, ChunkSize: rdmatest.TestChunkSize,
		Export: func(t testing.TB, seed uint64, size int) *tensor.Descriptor {
			t.Helper()
			r, err := co.call(context.Background(), &harnessMsg{Kind: "export", Seed: seed, Size: size})
			if err != nil {
				t.Fatalf("export of %d bytes: %v", size, err)
			}
			return r.Desc
		},
		Release: func(_ testing.TB, d *tensor.Descriptor) error {
			_, err := co.call(context.Background(), &harnessMsg{Kind: "release", Desc: d})
			return err
		},
		Kill: co.kill,
		Check: func() error {
			if _, err := co.call(context.Background(), &harnessMsg{Kind: "check"}); err != nil && !strings.Contains(err.Error(), "owner process gone") {
				return err
			}
			return nil
		},
	}
}

// TestConformanceTwoProcesses runs the suite with the owner in a child
// process: RDMA between two processes, and a real process death for kill.
func TestConformanceTwoProcesses(t *testing.T) {
	requireRDMA(t)
	rdmatest.TestChannel(t, twoProcessPair)
}

// TestOwnerKilledMidTransfer kills the owner process while reads are in
// flight: the fetch fails with ErrPeerDown within seconds.
func TestOwnerKilledMidTransfer(t *testing.T) {
	requireRDMA(t)
	p := twoProcessPair(t)
	const n = 64 << 20
	d := p.Export(t, 21, n)
	dst, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	h := dst.Host()
	for i := range h {
		h[i] = rdmatest.Poison
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- p.Fetcher.Fetch(ctx, d, dst) }()
	// Wait until the first chunk has landed: reads are in flight.
	deadline := time.Now().Add(time.Minute)
	for h[0] == rdmatest.Poison && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	p.Kill()
	killed := time.Now()
	select {
	case err := <-res:
		took := time.Since(killed)
		if err == nil {
			t.Skip("transfer finished before the kill")
		}
		if !errors.Is(err, rdma.ErrPeerDown) {
			t.Errorf("fetch from a killed owner: %v, want ErrPeerDown", err)
		}
		t.Logf("failed %v after the kill: %v", took, err)
	case <-time.After(30 * time.Second):
		c := p.Fetcher.(*Channel)
		c.mu.Lock()
		for name, fp := range c.fetches {
			st, err := fp.qp.State()
			fp.mu.Lock()
			t.Logf("connection to %s: QP %v %v, %d waiters, broken %v", name, st, err, len(fp.waiters), fp.broken)
			fp.mu.Unlock()
		}
		c.mu.Unlock()
		t.Fatalf("fetch from a killed owner hangs (%d fetching)", c.fetching.Load())
	}
}
