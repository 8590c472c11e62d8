package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/shm"
	"github.com/tensorferry/tensorferry/wire"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// nopHandler ignores everything and closes data connections.
type nopHandler struct{}

func (nopHandler) PeerUp(*Peer)                           {}
func (nopHandler) PeerDown(*Peer, error)                  {}
func (nopHandler) HandleFrame(*Peer, wire.Frame)          {}
func (nopHandler) HandleDataConn(_, _ string, c net.Conn) { c.Close() }

// flakyListener fails Accept with EMFILE bursts[i] times before the i-th
// connection it lets through.
type flakyListener struct {
	net.Listener
	mu     sync.Mutex
	bursts []int
	failed int // failures in the current burst
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.bursts) > 0 && l.failed < l.bursts[0] {
		l.failed++
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	if len(l.bursts) > 0 {
		l.bursts, l.failed = l.bursts[1:], 0
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// startAcceptLoop runs m's accept loop on ln (instead of Start's listeners);
// m.Close closes ln and waits for the loop.
func startAcceptLoop(m *Membership, ln net.Listener, data bool) {
	m.mu.Lock()
	m.lns = append(m.lns, ln)
	m.mu.Unlock()
	m.wg.Add(1)
	go m.acceptLoop(ln, data)
}

// dialAs opens a connection to addr and runs the initiator's handshake as
// node, returning the connection or the handshake error.
func dialAs(t *testing.T, cfg *config.Config, addr, node, purpose string) (net.Conn, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = wire.Handshake(ctx, nc, wire.HandshakeConfig{Cluster: cfg.Cluster, Node: node, Incarnation: 1, Secret: cfg.Secret, Purpose: purpose}, true)
	if err != nil {
		return nil, err
	}
	return nc, nil
}

func TestAcceptLoopRetriesAfterEMFILE(t *testing.T) {
	cfg, err := config.LocalConfig("accept", 2)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	m, err := NewMembership(cfg, "node0", 1, nopHandler{}, Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startAcceptLoop(m, &flakyListener{Listener: inner, bursts: []int{5, 3}}, false)

	// Each connection is accepted once its burst of EMFILE errors is over.
	for i := range 2 {
		nc, err := dialAs(t, cfg, inner.Addr().String(), "node1", wire.PurposeControl)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		nc.Close()
	}
	// One warning per burst, and one line when accepting works again.
	if got := logs.FilterMessage("accept failed; retrying with backoff").Len(); got != 2 {
		t.Errorf("%d accept warnings, want one per burst (2)", got)
	}
	again := logs.FilterMessage("accepting again").All()
	if len(again) != 2 || again[0].ContextMap()["failed_accepts"] != int64(5) || again[1].ContextMap()["failed_accepts"] != int64(3) {
		t.Errorf("recovery lines: %+v", again)
	}
}

// TestReadSpinReachesSharedMemory: transport.read_spin is the spin of the
// shared-memory rings too, unless Options.SharedMemory sets its own.
func TestReadSpinReachesSharedMemory(t *testing.T) {
	for _, tc := range []struct {
		readSpin, optSpin, want time.Duration
	}{
		{0, 0, 0}, // both defaults: shm's own, the same as a socket's
		{300 * time.Microsecond, 0, 300 * time.Microsecond},
		{config.ReadSpinOff, 0, config.ReadSpinOff},
		{300 * time.Microsecond, 20 * time.Microsecond, 20 * time.Microsecond},
	} {
		cfg, err := config.LocalConfig("spin", 1)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Transport.ReadSpin = tc.readSpin
		m, err := NewMembership(cfg, cfg.Nodes[0].Name, 1, nopHandler{}, Options{SharedMemory: shm.Config{Spin: tc.optSpin}})
		if err != nil {
			t.Fatal(err)
		}
		if m.shm.Spin != tc.want {
			t.Errorf("read_spin %v, shm spin option %v: rings spin %v, want %v", tc.readSpin, tc.optSpin, m.shm.Spin, tc.want)
		}
		m.Close()
	}
}

// A connection from a node the config names but gossip has not shown
// alive yet is refused to be retried (CodeUnavailable: `ferry ping`
// waits), one from a name nobody announced for good (CodeNotFound).
func TestNotMemberSaysWhatIsTrue(t *testing.T) {
	cfg, err := config.LocalConfig("g", 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = config.MembershipGossip
	m, err := NewMembership(cfg, "node0", 1, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		code wire.ErrCode
		says string
	}{
		{"node1", wire.CodeUnavailable, "its gossip has not shown it alive"},
		{"stranger", wire.CodeNotFound, "is not in the config"},
	} {
		var ce *wire.ConnError
		err := m.notMember(tc.name)
		if !errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want code %v saying %q", tc.name, err, tc.code, tc.says)
		}
		// Only the refusal to retry is logged below a warning (a cluster
		// that starts sees it; TestLogsNameTheNodeOnce/gossip failed on it).
		if got, want := notAliveYet(err), tc.code == wire.CodeUnavailable; got != want {
			t.Errorf("%s: notAliveYet %v, want %v", tc.name, got, want)
		}
	}
	if notAliveYet(nil) || notAliveYet(errors.New(reasonNotAliveYet)) {
		t.Error("notAliveYet of an error that is not a refusal")
	}
}

// TestPeerClosed: a shared-memory upgrade that fails because the peer
// closed or reset the connection (it stopped) is told from a fault.
func TestPeerClosed(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("shm: read offer: %w", reset), true},
		{fmt.Errorf("shm: read offer: %w", io.EOF), true},
		{fmt.Errorf("shm: read offer: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("shm: send offer: %w", syscall.EPIPE), true},
		{fmt.Errorf("shm: upgrade: %w", context.DeadlineExceeded), false},
		{errors.New("shm: the offer's nonce is wrong"), false},
	} {
		if got := peerClosed(c.err); got != c.want {
			t.Errorf("peerClosed(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
