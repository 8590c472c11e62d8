package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

func testConfig(node string) HandshakeConfig {
	return HandshakeConfig{Cluster: "test", Node: node, Incarnation: 7, Secret: testSecret, Timeout: 2 * time.Second}
}

type result struct {
	peer Remote
	err  error
}

// recordingConn records what is read from and written to a net.Conn.
type recordingConn struct {
	net.Conn
	mu      sync.Mutex
	read    bytes.Buffer
	written bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.written.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (c *recordingConn) bytesRead() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.read.Bytes())
}

func (c *recordingConn) bytesWritten() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.written.Bytes())
}

// handshakePair runs both sides over a in-memory pipe.
func handshakePair(t *testing.T, ic, ac HandshakeConfig) (ini, acc result, iconn *recordingConn, aconn net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	iconn = &recordingConn{Conn: a}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		acc.peer, acc.err = Handshake(context.Background(), b, ac, false)
	}()
	ini.peer, ini.err = Handshake(context.Background(), iconn, ic, true)
	wg.Wait()
	t.Cleanup(func() { a.Close(); b.Close() })
	return ini, acc, iconn, b
}

// framesIn decodes the frames in b.
func framesIn(t *testing.T, b []byte) []Frame {
	t.Helper()
	fr := NewFramer(nil, bytes.NewReader(b))
	var out []Frame
	for {
		f, err := fr.ReadFrame()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("recorded bytes: %v", err)
		}
		out = append(out, f)
	}
}

func TestHandshakeSuccess(t *testing.T) {
	for _, purpose := range []string{"", PurposeControl, PurposeData} {
		ic, ac := testConfig("ini"), testConfig("acc")
		ic.Purpose, ic.Incarnation, ic.Expect = purpose, 11, "acc"
		ac.Incarnation = 22
		ini, acc, iconn, aconn := handshakePair(t, ic, ac)
		if ini.err != nil || acc.err != nil {
			t.Fatalf("initiator: %v, acceptor: %v", ini.err, acc.err)
		}
		want := purpose
		if want == "" {
			want = PurposeControl
		}
		if ini.peer != (Remote{"acc", 22, want, false}) {
			t.Errorf("initiator's peer %+v", ini.peer)
		}
		if acc.peer != (Remote{"ini", 11, want, false}) {
			t.Errorf("acceptor's peer %+v", acc.peer)
		}
		// The connection works afterwards, with the deadline cleared.
		go iconn.Write([]byte("x"))
		buf := make([]byte, 1)
		if _, err := io.ReadFull(aconn, buf); err != nil || buf[0] != 'x' {
			t.Fatalf("after handshake: %v", err)
		}
	}
}

// deadlineConn records the deadlines set on a net.Conn.
type deadlineConn struct {
	net.Conn
	mu  sync.Mutex
	set []time.Time
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = append(c.set, t)
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = append(c.set, t)
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = append(c.set, t)
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

// last returns the last deadline set, if any was.
func (c *deadlineConn) last() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.set) == 0 {
		return time.Time{}, false
	}
	return c.set[len(c.set)-1], true
}

func TestHandshakeTCPAndDeadlineCleared(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ac := testConfig("acc")
	ac.Timeout = 50 * time.Millisecond
	done := make(chan result, 1)
	var server net.Conn
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		dc := &deadlineConn{Conn: c}
		server = dc
		p, err := Handshake(context.Background(), dc, ac, false)
		done <- result{p, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ic := testConfig("ini")
	ic.Timeout = 50 * time.Millisecond
	rc := &deadlineConn{Conn: c}
	if _, err := Handshake(context.Background(), rc, ic, true); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer server.Close()
	// No waiting past the handshake timeout to see that its deadline is
	// gone: the last deadline each end set is the zero time.
	for _, d := range []*deadlineConn{rc, server.(*deadlineConn)} {
		if last, ok := d.last(); !ok || !last.IsZero() {
			t.Fatalf("last deadline set %v (set: %v), want the zero time", last, ok)
		}
	}
	if _, err := c.Write([]byte("late")); err != nil {
		t.Fatalf("write after the handshake timeout: %v", err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(server, buf); err != nil {
		t.Fatalf("read after the handshake timeout: %v", err)
	}
}

func TestHandshakeWrongSecret(t *testing.T) {
	ic, ac := testConfig("ini"), testConfig("secret-acceptor-name")
	ic.Secret = []byte("another secret of enough length!")
	ac.Incarnation = 0x5eC7e7
	ini, acc, iconn, _ := handshakePair(t, ic, ac)
	if !errors.Is(ini.err, ErrAuthFailed) {
		t.Errorf("initiator: %v, want ErrAuthFailed", ini.err)
	}
	if !errors.Is(acc.err, ErrAuthFailed) {
		t.Errorf("acceptor: %v, want ErrAuthFailed", acc.err)
	}
	// The initiator learned nothing: a challenge, then a GoAway with a code.
	got := iconn.bytesRead()
	if bytes.Contains(got, []byte("secret-acceptor-name")) {
		t.Fatal("the acceptor's node name reached an unauthenticated initiator")
	}
	frames := framesIn(t, got)
	if len(frames) != 2 {
		t.Fatalf("initiator received %d frames: %v", len(frames), frames)
	}
	if ch, ok := frames[0].(*ChallengeFrame); !ok || ch.Challenge.Version != ProtocolVersion || len(ch.Challenge.Nonce) != NonceSize {
		t.Fatalf("first frame %#v", frames[0])
	}
	if ga, ok := frames[1].(*GoAwayFrame); !ok || ga.GoAway != (GoAway{Code: CodeAuth}) {
		t.Fatalf("second frame %#v", frames[1])
	}
}

// A fake acceptor without the secret cannot fool the initiator.
func TestHandshakeImpostorAcceptor(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		fr := NewFramer(b, b)
		if _, err := fr.ReadFrame(); err != nil {
			return
		}
		fr.WriteChallenge(&Challenge{Version: ProtocolVersion, Nonce: make([]byte, NonceSize)})
		if _, err := fr.ReadFrame(); err != nil {
			return
		}
		fr.WriteWelcome(&Welcome{Node: "evil", Incarnation: 1, MAC: make([]byte, 32)})
		io.Copy(io.Discard, b)
	}()
	_, err := Handshake(context.Background(), a, testConfig("ini"), true)
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("got %v, want ErrAuthFailed", err)
	}
}

func TestHandshakeWrongCluster(t *testing.T) {
	ic, ac := testConfig("ini"), testConfig("acc")
	ic.Cluster = "other"
	ini, acc, iconn, _ := handshakePair(t, ic, ac)
	// The initiator is refused as for a wrong secret; the acceptor knows why.
	if !errors.Is(ini.err, ErrAuthFailed) || errors.Is(ini.err, ErrClusterMismatch) {
		t.Errorf("initiator: %v, want ErrAuthFailed only", ini.err)
	}
	if !errors.Is(acc.err, ErrClusterMismatch) || !errors.Is(acc.err, ErrAuthFailed) || !strings.Contains(acc.err.Error(), `"other"`) {
		t.Errorf("acceptor: %v, want ErrClusterMismatch naming \"other\" and ErrAuthFailed", acc.err)
	}
	frames := framesIn(t, iconn.bytesRead())
	if len(frames) != 2 || frames[1].(*GoAwayFrame).GoAway != (GoAway{Code: CodeAuth}) {
		t.Fatalf("initiator received %v", frames)
	}
}

// An unauthenticated prober cannot tell a wrong cluster name from a wrong
// secret: it receives the same frames (up to the random nonce) and the same
// error.
func TestHandshakeWrongClusterLooksLikeWrongSecret(t *testing.T) {
	seen := func(change func(c *HandshakeConfig)) (wireBytes []byte, err error) {
		ic, ac := testConfig("ini"), testConfig("acc")
		change(&ic)
		ini, _, iconn, _ := handshakePair(t, ic, ac)
		// Re-encode what the initiator read with the challenge nonce zeroed.
		var buf bytes.Buffer
		fr := NewFramer(&buf, nil)
		for _, f := range framesIn(t, iconn.bytesRead()) {
			switch f := f.(type) {
			case *ChallengeFrame:
				ch := f.Challenge
				ch.Nonce = make([]byte, len(ch.Nonce))
				fr.WriteChallenge(&ch)
			case *GoAwayFrame:
				fr.WriteGoAway(&f.GoAway)
			default:
				t.Fatalf("unexpected %v", f.Header())
			}
		}
		return buf.Bytes(), ini.err
	}
	clusterBytes, clusterErr := seen(func(c *HandshakeConfig) { c.Cluster = "guess" })
	secretBytes, secretErr := seen(func(c *HandshakeConfig) { c.Secret = []byte("another secret of enough length!") })
	if !bytes.Equal(clusterBytes, secretBytes) {
		t.Errorf("wrong cluster: initiator read\n%x\nwrong secret:\n%x", clusterBytes, secretBytes)
	}
	if clusterErr == nil || secretErr == nil || clusterErr.Error() != secretErr.Error() {
		t.Errorf("wrong cluster: %v\nwrong secret:  %v", clusterErr, secretErr)
	}
}

// Admit refuses an authenticated initiator with a reason it can read.
func TestHandshakeAdmitRefuses(t *testing.T) {
	ic, ac := testConfig("ini"), testConfig("acc")
	var admitted Remote
	why := &ConnError{Code: CodeNotFound, Reason: `node "ini" is not in the config`}
	ac.Admit = func(p Remote) error { admitted = p; return why }
	ini, acc, iconn, _ := handshakePair(t, ic, ac)
	if admitted != (Remote{"ini", 7, PurposeControl, false}) {
		t.Errorf("Admit got %+v", admitted)
	}
	if !errors.Is(acc.err, why) {
		t.Errorf("acceptor: %v, want it to wrap Admit's error", acc.err)
	}
	var ce *ConnError
	if !errors.As(ini.err, &ce) || ce.Code != CodeNotFound || !strings.Contains(ini.err.Error(), `node \"ini\" is not in the config`) {
		t.Errorf("initiator: %v, want a NotFound refusal quoting the reason", ini.err)
	}
	// The refused initiator never gets the acceptor's proof.
	frames := framesIn(t, iconn.bytesRead())
	if len(frames) != 2 || frames[1].(*GoAwayFrame).GoAway != (GoAway{Code: CodeNotFound, Reason: why.Error()}) {
		t.Fatalf("initiator received %v", frames)
	}

	// A plain error is refused as Unavailable.
	ac.Admit = func(Remote) error { return errors.New("too many connections") }
	ini, _, _, _ = handshakePair(t, ic, ac)
	if !errors.As(ini.err, &ce) || ce.Code != CodeUnavailable || !strings.Contains(ini.err.Error(), "too many connections") {
		t.Errorf("initiator: %v", ini.err)
	}
}

func TestHandshakeExpect(t *testing.T) {
	ic, ac := testConfig("ini"), testConfig("acc")
	ic.Expect = "someone-else"
	ini, acc, _, _ := handshakePair(t, ic, ac)
	if !errors.Is(ini.err, ErrUnexpectedPeer) {
		t.Fatalf("initiator: %v", ini.err)
	}
	if acc.err != nil { // the acceptor finished before the initiator refused
		t.Logf("acceptor: %v", acc.err)
	}
}

func TestHandshakeAcceptorPurpose(t *testing.T) {
	ic, ac := testConfig("ini"), testConfig("acc")
	ic.Purpose, ac.Purpose = PurposeData, PurposeControl
	ini, acc, _, _ := handshakePair(t, ic, ac)
	var ce *ConnError
	if !errors.As(acc.err, &ce) || ini.err == nil {
		t.Fatalf("initiator: %v, acceptor: %v", ini.err, acc.err)
	}
}

// rawAcceptor runs an acceptor against script, which plays the initiator
// by hand, and returns the acceptor's error.
func rawAcceptor(t *testing.T, cfg HandshakeConfig, script func(fr *Framer)) error {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := Handshake(context.Background(), a, cfg, false)
		errc <- err
	}()
	script(NewFramer(b, b))
	b.Close()
	return <-errc
}

func TestHandshakeWrongVersion(t *testing.T) {
	var got Frame
	err := rawAcceptor(t, testConfig("acc"), func(fr *Framer) {
		fr.WriteHello(&Hello{Version: ProtocolVersion + 1, Cluster: "test", Nonce: make([]byte, NonceSize), Purpose: PurposeControl})
		got, _ = fr.ReadFrame()
	})
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("acceptor: %v", err)
	}
	if ga, ok := got.(*GoAwayFrame); !ok || ga.GoAway != (GoAway{Code: CodeVersion}) {
		t.Fatalf("initiator received %#v", got)
	}

	// An acceptor answering with another version.
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		fr := NewFramer(b, b)
		fr.ReadFrame()
		fr.WriteChallenge(&Challenge{Version: ProtocolVersion + 1, Nonce: make([]byte, NonceSize)})
		io.Copy(io.Discard, b)
	}()
	if _, err := Handshake(context.Background(), a, testConfig("ini"), true); !errors.Is(err, ErrVersion) {
		t.Fatalf("initiator: %v", err)
	}
}

func TestHandshakeRefusedByGoAway(t *testing.T) {
	for code, want := range map[ErrCode]error{CodeVersion: ErrVersion, CodeCluster: ErrClusterMismatch, CodeAuth: ErrAuthFailed} {
		a, b := net.Pipe()
		go func() {
			fr := NewFramer(b, b)
			fr.ReadFrame()
			fr.WriteGoAway(&GoAway{Code: code})
			b.Close()
		}()
		if _, err := Handshake(context.Background(), a, testConfig("ini"), true); !errors.Is(err, want) {
			t.Fatalf("GoAway %s: %v", code, err)
		}
	}
}

func TestHandshakeReplay(t *testing.T) {
	ini, acc, iconn, _ := handshakePair(t, testConfig("ini"), testConfig("acc"))
	if ini.err != nil || acc.err != nil {
		t.Fatal(ini.err, acc.err)
	}
	recorded := iconn.bytesWritten()
	if n := len(framesIn(t, recorded)); n != 2 {
		t.Fatalf("recorded %d initiator frames, want Hello and Auth", n)
	}
	// A fresh acceptor gets the same bytes: its nonce differs, the MAC fails.
	var answers []Frame
	err := rawAcceptor(t, testConfig("acc"), func(fr *Framer) {
		wrote := make(chan struct{})
		defer func() { <-wrote }()
		go func() {
			defer close(wrote)
			fr.w.Write(recorded)
		}()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			answers = append(answers, f)
		}
	})
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("replay: %v", err)
	}
	for _, f := range answers {
		if _, ok := f.(*WelcomeFrame); ok {
			t.Fatal("replayed handshake got a Welcome")
		}
	}
}

func TestHandshakeNonHandshakeFrameFirst(t *testing.T) {
	err := rawAcceptor(t, testConfig("acc"), func(fr *Framer) {
		fr.WriteMessage(0, &Message{Target: "x"})
		fr.ReadFrame()
	})
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Code != CodeProtocol {
		t.Fatalf("got %v", err)
	}
}

func TestHandshakeSilentPeerTimesOut(t *testing.T) {
	for _, initiator := range []bool{true, false} {
		a, b := net.Pipe()
		go io.Copy(io.Discard, b) // reads, never answers
		cfg := testConfig("x")
		cfg.Timeout = 100 * time.Millisecond
		start := time.Now()
		_, err := Handshake(context.Background(), a, cfg, initiator)
		d := time.Since(start)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("initiator=%v: %v, want a deadline error", initiator, err)
		}
		if d < 90*time.Millisecond || d > time.Second {
			t.Errorf("initiator=%v: returned after %v, timeout 100ms", initiator, d)
		}
		b.Close()
	}
}

func TestHandshakeContextCancel(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go io.Copy(io.Discard, b)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := Handshake(ctx, a, testConfig("x"), true)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestHandshakeConfigValidation(t *testing.T) {
	bad := []func(*HandshakeConfig){
		func(c *HandshakeConfig) { c.Cluster = "" },
		func(c *HandshakeConfig) { c.Node = "" },
		func(c *HandshakeConfig) { c.Secret = []byte("short") },
		func(c *HandshakeConfig) { c.Purpose = "bulk" },
	}
	for i, mod := range bad {
		cfg := testConfig("x")
		mod(&cfg)
		a, b := net.Pipe()
		_, err := Handshake(context.Background(), a, cfg, true)
		if err == nil {
			t.Errorf("case %d: accepted", i)
		}
		b.Close()
	}
}

func TestTranscriptBindsEveryField(t *testing.T) {
	base := transcript{version: 1, cluster: "c", purpose: "control", nonceI: []byte{1}, nonceA: []byte{2},
		nodeI: "i", incI: 1, nodeA: "a", incA: 2}
	mods := []func(*transcript){
		func(x *transcript) { x.version = 2 },
		func(x *transcript) { x.cluster = "d" },
		func(x *transcript) { x.purpose = "data" },
		func(x *transcript) { x.nonceI = []byte{3} },
		func(x *transcript) { x.nonceA = []byte{3} },
		func(x *transcript) { x.nodeI = "j" },
		func(x *transcript) { x.incI = 3 },
		func(x *transcript) { x.nodeA = "b" },
		func(x *transcript) { x.incA = 3 },
		// Moving bytes between adjacent fields changes the MAC too.
		func(x *transcript) { x.cluster, x.purpose = "cc", "ontrol" },
	}
	want := base.mac(testSecret, labelAcceptor, true)
	if bytes.Equal(want, base.mac(testSecret, labelInitiator, true)) {
		t.Fatal("labels do not separate the MACs")
	}
	for i, mod := range mods {
		x := base
		mod(&x)
		if bytes.Equal(x.mac(testSecret, labelAcceptor, true), want) {
			t.Errorf("modification %d does not change the MAC", i)
		}
	}
}
