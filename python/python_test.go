package python_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/internal/etcdtest"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Vec is the message the Go node and the Python node (tests/peer.py)
// exchange: the Python side writes the same fields in this order.
type Vec struct {
	Scale float64
	X     *tensor.Tensor
	Note  string
}

// RefVec carries a lazy tensor.Ref: the Python node gets a tensorferry.Ref.
type RefVec struct {
	Scale float64
	R     tensor.Ref
	Note  string
}

func init() {
	actor.MustRegisterMessage("py.Vec", &Vec{})
	actor.MustRegisterMessage("py.RefVec", &RefVec{})
}

// python returns the interpreter with torch and msgpack, or skips the test
// saying why.
func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("TF_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python at %s (set TF_PYTHON; scripts/deps.sh installs python3-torch python3-msgpack): %v", py, err)
	}
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("%s lacks torch (scripts/deps.sh installs python3-torch): %v: %s", py, err, out)
	}
	return py
}

// peer is the Python node run by tests/peer.py.
type peer struct {
	t     *testing.T
	in    io.WriteCloser
	lines chan string
	cmd   *exec.Cmd
}

func startPeer(t *testing.T, cfg *config.Config, self, goNode int, env ...string) *peer {
	t.Helper()
	return startPeerTLS(t, cfg, cfg.TLS, self, goNode, env...)
}

// startPeerTLS starts the Python node with the TLS files of tc (nil: plain
// TCP), which may differ from the Go nodes' cfg.TLS.
func startPeerTLS(t *testing.T, cfg *config.Config, tc *config.TLSConfig, self, goNode int, env ...string) *peer {
	t.Helper()
	py := python(t)
	var tlsBlock any
	if tc != nil {
		tlsBlock = map[string]any{"cert_file": tc.CertFile, "key_file": tc.KeyFile, "ca_file": tc.CAFile, "data": tc.Data}
	}
	return runPeer(t, py, peerConfig(cfg, tlsBlock, self, goNode), env...)
}

// peerConfig is the config of the Python node cfg.Nodes[self], whose
// peer is the Go node cfg.Nodes[goNode] (TF_PEER_CONFIG of tests/peer.py).
func peerConfig(cfg *config.Config, tlsBlock any, self, goNode int) map[string]any {
	return map[string]any{
		"tls":     tlsBlock,
		"cluster": cfg.Cluster, "secret": string(cfg.Secret), "name": cfg.Nodes[self].Name,
		"address": cfg.Nodes[self].Address, "data_address": cfg.Nodes[self].DataAddress, "go": cfg.Nodes[goNode].Name,
		"peers": map[string]any{cfg.Nodes[goNode].Name: map[string]string{
			"address": cfg.Nodes[goNode].Address, "data_address": cfg.Nodes[goNode].DataAddress}},
		"inline_threshold": cfg.Transport.InlineThreshold,
		"heartbeat":        cfg.HeartbeatInterval.Seconds(), "failure_timeout": cfg.FailureTimeout.Seconds(),
		"dial_timeout":  cfg.DialTimeout.Seconds(),
		"reconnect_min": cfg.ReconnectMin.Seconds(), "reconnect_max": cfg.ReconnectMax.Seconds(),
	}
}

// runPeer runs tests/peer.py with py and the config conf, and waits until
// it listens.
func runPeer(t *testing.T, py string, conf map[string]any, env ...string) *peer {
	t.Helper()
	pc, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join("tests", "peer.py"))
	cmd.Env = append(append(os.Environ(), "TF_PEER_CONFIG="+string(pc), "PYTHONDONTWRITEBYTECODE=1"), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, in: in, lines: make(chan string, 64), cmd: cmd}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() {
			for range p.lines { // drain until the process ends
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = cmd.Wait()
	})
	p.expect("listening")
	return p
}

// expect waits for the next line that is not an up/down notice, and
// fails unless it starts with prefix. It returns the line.
func (p *peer) expect(prefix string) string {
	p.t.Helper()
	return p.nextLine(prefix, func(l string) bool { return strings.HasPrefix(l, "up ") || strings.HasPrefix(l, "down ") }, true)
}

// expectLine waits for a line that starts with prefix, skipping the others.
func (p *peer) expectLine(prefix string) string {
	p.t.Helper()
	return p.nextLine(prefix, func(l string) bool { return !strings.HasPrefix(l, prefix) }, false)
}

// nextLine returns the first line from the peer that skip does not skip,
// within 20s; with strict, that line must start with prefix.
func (p *peer) nextLine(prefix string, skip func(string) bool, strict bool) string {
	p.t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("python peer exited; wanted %q", prefix)
			}
			if skip(l) {
				continue
			}
			if strict && !strings.HasPrefix(l, prefix) {
				p.t.Fatalf("python peer said %q, want %q", l, prefix)
			}
			return l
		case <-timeout.C:
			p.t.Fatalf("python peer: no %q in 20s", prefix)
		}
	}
}

func (p *peer) do(cmd, want string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		p.t.Fatal(err)
	}
	return p.expect(want)
}

func scaleProps() *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		v, ok := c.Message().(*Vec)
		if !ok {
			return
		}
		x := v.X.Float32s()
		out := make([]float32, len(x))
		for i := range x {
			out[i] = x[i] * float32(v.Scale)
		}
		y, err := tensor.FromFloat32s(out, v.X.Shape())
		if err != nil {
			panic(err)
		}
		c.Respond(&Vec{Scale: v.Scale, X: y, Note: "scaled by go"})
	})
}

// TestPythonPeer runs a Go node and a Python node of one config: requests
// both ways with CPU tensors inline, a hostile message from the Python
// side refused without harm, and a tensor above the inline threshold
// refused by the Python side with an error that says why.
func TestPythonPeer(t *testing.T) {
	cfg, err := config.LocalConfig("pytest", 2)
	if err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, cfg, 1, 0)
	node := startGo(t, cfg, zap.NewNop())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.WaitPeer(ctx, cfg.Nodes[1].Name); err != nil {
		t.Fatal(err)
	}
	p.do("wait", "ok wait")

	// Go → Python: a request to the Python handler "double".
	for _, n := range []int{0, 1, 1000} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i) - 3.5
		}
		xt, err := tensor.FromFloat32s(x, tensor.Shape{int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		res, err := node.Request(ctx, node.PID(cfg.Nodes[1].Name, "double"), &Vec{Scale: 0.5, X: xt, Note: "from go"})
		if err != nil {
			t.Fatalf("request of %d elements to python: %v", n, err)
		}
		v, ok := res.(*Vec)
		if !ok || v.Note != "doubled by python" || v.Scale != 0.5 {
			t.Fatalf("reply %#v", res)
		}
		got := v.X.Float32s()
		if len(got) != n {
			t.Fatalf("reply of %d elements, want %d", len(got), n)
		}
		for i := range got {
			if got[i] != 2*x[i] {
				t.Fatalf("element %d: %v, want %v", i, got[i], 2*x[i])
			}
		}
	}
	// A request to a handler the Python node lacks fails at once.
	if _, err := node.Request(ctx, node.PID(cfg.Nodes[1].Name, "nobody"), &Vec{}); err == nil {
		t.Fatal("request to a missing python handler succeeded")
	}

	// Go → Python through staging: a tensor above the inline threshold is
	// exported by the Go node and fetched by the Python node, which
	// releases it.
	n := cfg.Transport.InlineThreshold/4*16 + 3
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i % 7)
	}
	xt, err := tensor.FromFloat32s(x, tensor.Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := node.Request(ctx, node.PID(cfg.Nodes[1].Name, "sum"), &Vec{X: xt})
	if err != nil {
		t.Fatalf("request with %d bytes to python: %v", 4*n, err)
	}
	var want float32
	for _, v := range x {
		want += v
	}
	if v, ok := res.(*Vec); !ok || v.Scale != float64(n) || v.X.Float32s()[0] != want {
		t.Fatalf("sum reply %#v, want %v", res, want)
	}
	if err := xt.WaitReleased(ctx); err != nil {
		t.Fatalf("the python node did not release the tensor it fetched: %v", err)
	}
	if l := p.do("transfers", "transfers"); !strings.Contains(l, fmt.Sprintf(`["staging", "%s", %d]`, cfg.Nodes[0].Name, 4*n)) {
		t.Fatalf("python node's transfers: %s", l)
	}

	// A Python handler that itself requests a reply above the inline
	// threshold from the Go node.
	res, err = node.Request(ctx, node.PID(cfg.Nodes[1].Name, "relay"), &Vec{})
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	if v, ok := res.(*Vec); !ok || v.Note != "relayed" || v.Scale != float64(2*(cfg.Transport.InlineThreshold/4*4+1)) {
		t.Fatalf("relay reply %#v", res)
	}

	// Python → Go.
	p.do("request 1", "ok request")
	p.do("request 4096", "ok request")
	// Bad input from the Python peer: refused, and the Go node goes on
	// serving it on the same connection.
	p.do("hostile", "ok hostile")
	p.do("request 7", "ok request")
	// Python → Go and back through staging.
	p.do("big", "ok big")
	if l := p.do("transfers", "transfers"); strings.Count(l, `"staging"`) != 3 {
		t.Fatalf("python node's transfers: %s", l)
	}
	// Without a data address, a tensor above the inline threshold is
	// refused by the sender with an error that says why.
	p.do("nodata", "ok nodata")
}

// TestPythonUnit runs the Python package's own tests (codec against the
// golden bytes, hostile input, hypothesis properties, staging frames).
func TestPythonUnit(t *testing.T) {
	py := python(t)
	if out, err := exec.Command(py, "-c", "import hypothesis").CombinedOutput(); err != nil {
		t.Skipf("%s lacks hypothesis (scripts/deps.sh installs python3-hypothesis): %v: %s", py, err, out)
	}
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-p", "test_*.py")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
}

// refSumProps answers a py.RefVec with the sum of its Ref's tensor,
// fetched into host memory.
func refSumProps() *pa.Props {
	return pa.PropsFromFunc(func(c pa.Context) {
		v, ok := c.Message().(*RefVec)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		x, err := v.R.Fetch(ctx, memory.CPU)
		if err != nil {
			c.Respond(&RefVec{Note: "fetch failed: " + err.Error()})
			return
		}
		var sum float64
		for _, f := range x.Float32s() {
			sum += float64(f)
		}
		c.Respond(&RefVec{Scale: sum, Note: "fetched by go"})
	})
}

// TestPythonRef sends tensor.Ref fields between a Go node and a Python
// node: a Ref the Python handler fetches (staging, CPU) and answers with
// its sum, one it releases unfetched, one it keeps and fetches after the
// handler returned, from another thread; the Go owner's tensors have no
// lease left after each; one it forwards to a Go actor. And a
// tensorferry.Ref from Python that a Go actor fetches, and a kept Ref
// whose owner went down.
func TestPythonRef(t *testing.T) {
	cfg, err := config.LocalConfig("pyref", 2)
	if err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, cfg, 1, 0)
	node := startGoWith(t, cfg, zap.NewNop(), "refsum", refSumProps())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.WaitPeer(ctx, cfg.Nodes[1].Name); err != nil {
		t.Fatal(err)
	}
	p.do("wait", "ok wait")

	vec := func(n int) (*tensor.Tensor, float64) {
		x := make([]float32, n)
		var sum float64
		for i := range x {
			x[i] = float32(i%13) - 4
			sum += float64(x[i])
		}
		xt, err := tensor.FromFloat32s(x, tensor.Shape{int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		return xt, sum
	}
	py := func(id string) *pa.PID { return node.PID(cfg.Nodes[1].Name, id) }
	// Fetched by the Python handler, small and above the inline threshold
	// alike (a Ref is never inline).
	for _, n := range []int{0, 3, cfg.Transport.InlineThreshold/4*2 + 1} {
		xt, sum := vec(n)
		res, err := node.Request(ctx, py("refsum"), &RefVec{R: tensor.NewRef(xt)})
		if err != nil {
			t.Fatalf("ref of %d elements: %v", n, err)
		}
		if v, ok := res.(*RefVec); !ok || v.Note != "fetched" || v.Scale != sum {
			t.Fatalf("ref of %d elements: reply %#v, want the sum %v", n, res, sum)
		}
		if err := xt.WaitReleased(ctx); err != nil {
			t.Fatalf("ref of %d elements: the python node did not release it: %v", n, err)
		}
	}
	// Released unfetched.
	xt, _ := vec(100)
	res, err := node.Request(ctx, py("refsum"), &RefVec{R: tensor.NewRef(xt), Note: "release"})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.(*RefVec); !ok || v.Note != "released" {
		t.Fatalf("release: reply %#v", res)
	}
	if err := xt.WaitReleased(ctx); err != nil {
		t.Fatalf("the python node did not release the ref: %v", err)
	}
	// Kept by the handler, fetched later from the Python main thread.
	xt, sum := vec(50)
	res, err = node.Request(ctx, py("refkeep"), &RefVec{R: tensor.NewRef(xt)})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.(*RefVec); !ok || v.Note != "kept" || v.Scale != 200 {
		t.Fatalf("keep: reply %#v", res)
	}
	if xt.Leases() == 0 {
		t.Fatal("the kept ref's lease is gone before its fetch")
	}
	if l := p.do("fetchkept", "ok fetchkept"); l != fmt.Sprintf("ok fetchkept %.1f 50", sum) {
		t.Fatalf("fetchkept: %s, want the sum %v", l, sum)
	}
	if err := xt.WaitReleased(ctx); err != nil {
		t.Fatalf("the python node did not release the kept ref: %v", err)
	}
	if l := p.do("transfers", "transfers"); strings.Count(l, `"staging"`) != 4 {
		t.Fatalf("python node's transfers: %s", l)
	}
	// Forwarded by the Python node to a Go actor, which fetches it from
	// its owner.
	xt, sum = vec(70)
	res, err = node.Request(ctx, py("refforward"), &RefVec{R: tensor.NewRef(xt)})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.(*RefVec); !ok || v.Note != "forwarded, fetched by go" || v.Scale != sum {
		t.Fatalf("forward: reply %#v, want the sum %v", res, sum)
	}
	if err := xt.WaitReleased(ctx); err != nil {
		t.Fatalf("the forwarded ref was not released: %v", err)
	}
	// Python → Go: a tensorferry.Ref the Go actor fetches.
	p.do("refrequest 1000", "ok refrequest")
	if l := p.do("errors", "errors"); l != "errors []" {
		t.Fatalf("python node's errors: %s", l)
	}
	// A kept Ref whose owner went down: its fetch fails with an error
	// that says so, it does not hang.
	xt, _ = vec(50)
	if _, err := node.Request(ctx, py("refkeep"), &RefVec{R: tensor.NewRef(xt)}); err != nil {
		t.Fatal(err)
	}
	if err := node.Stop(); err != nil {
		t.Fatal(err)
	}
	if l := p.do("fetchkept", "bad fetchkept"); !strings.Contains(l, "fetch of a Ref") && !strings.Contains(l, "is down") {
		t.Fatalf("fetch of a ref whose owner is down: %s", l)
	}
}

// startGo starts the Go node cfg.Nodes[0] with the actor "scale".
func startGo(t *testing.T, cfg *config.Config, log *zap.Logger) *actor.Node {
	t.Helper()
	return startGoWith(t, cfg, log, "scale", scaleProps())
}

// startGoWith starts the Go node cfg.Nodes[0] with one actor, name of
// props; the node stops at the end of the test.
func startGoWith(t *testing.T, cfg *config.Config, log *zap.Logger, name string, props *pa.Props) *actor.Node {
	t.Helper()
	node, err := actor.NewNode(cfg, cfg.Nodes[0].Name, actor.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop() })
	if _, err := node.Root().SpawnNamed(props, name); err != nil {
		t.Fatal(err)
	}
	return node
}

// TestPythonPeerTLS runs a Go node and a Python node of a config with TLS
// on control and data connections (certificates made for the test):
// requests both ways, inline and through staging in each direction.
func TestPythonPeerTLS(t *testing.T) {
	cfg, err := config.LocalConfig("pytls", 2)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS, err = config.LocalTLS(t.TempDir(), true); err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, cfg, 1, 0)
	node := startGo(t, cfg, zap.NewNop())
	py := cfg.Nodes[1].Name
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.WaitPeer(ctx, py); err != nil {
		t.Fatal(err)
	}
	p.do("wait", "ok wait")

	// Go → Python, inline.
	xt, err := tensor.FromFloat32s([]float32{1, -2, 3.5}, tensor.Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	res, err := node.Request(ctx, node.PID(py, "double"), &Vec{Scale: 1, X: xt})
	if err != nil {
		t.Fatalf("request to python over tls: %v", err)
	}
	if v, ok := res.(*Vec); !ok || v.Note != "doubled by python" || fmt.Sprint(v.X.Float32s()) != "[2 -4 7]" {
		t.Fatalf("reply %#v", res)
	}
	// Go → Python through staging: the Python node dials the Go node's
	// data address, under TLS.
	n := cfg.Transport.InlineThreshold/4*4 + 9
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	if xt, err = tensor.FromFloat32s(x, tensor.Shape{int64(n)}); err != nil {
		t.Fatal(err)
	}
	res, err = node.Request(ctx, node.PID(py, "sum"), &Vec{X: xt})
	if err != nil {
		t.Fatalf("request with %d bytes to python over tls: %v", 4*n, err)
	}
	if v, ok := res.(*Vec); !ok || v.X.Float32s()[0] != float32(n) {
		t.Fatalf("sum reply %#v, want %d", res, n)
	}
	if err := xt.WaitReleased(ctx); err != nil {
		t.Fatalf("the python node did not release the tensor it fetched: %v", err)
	}
	// Python → Go, inline and both ways through staging (the Go node
	// dials the Python node's data address).
	p.do("request 7", "ok request")
	p.do("big", "ok big")
	if l := p.do("transfers", "transfers"); strings.Count(l, `"staging"`) != 2 {
		t.Fatalf("python node's transfers: %s", l)
	}
	if l := p.do("errors", "errors"); l != "errors []" {
		t.Fatalf("python node's errors: %s", l)
	}
}

// TestPythonPeerTLSOtherCA: a Python node whose certificate another CA
// signed is refused by the Go node's TLS handshake, and never comes up.
func TestPythonPeerTLSOtherCA(t *testing.T) {
	cfg, err := config.LocalConfig("pytls", 2)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS, err = config.LocalTLS(t.TempDir(), true); err != nil {
		t.Fatal(err)
	}
	other, err := config.LocalTLS(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	py := cfg.Nodes[1].Name
	p := startPeerTLS(t, cfg, other, 1, 0)
	logs := &logCore{ch: make(chan string, 256)}
	node := startGo(t, cfg, zap.New(logs))
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for refused := false; !refused; {
		select {
		case l := <-logs.ch:
			refused = strings.Contains(l, "dial failed") && strings.Contains(l, py) &&
				strings.Contains(l, "tls handshake") && strings.Contains(l, "certificate signed by unknown authority")
		case <-timeout.C:
			t.Fatal("no refused tls handshake with the python node in 20s")
		}
	}
	if err := node.PeerError(py); err == nil || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("peer error %v, want the tls handshake's", err)
	}
	if _, up := node.Topology().Peers[py]; up {
		t.Fatal("the python node is up")
	}
	// The Python node goes on serving: it answers its commands.
	p.do("transfers", "transfers []")
}

// logCore is a zap core that hands each entry, with its fields, to ch
// (dropped when ch is full: the Go node retries its dials).
type logCore struct {
	ch     chan string
	fields []zapcore.Field
}

func (c *logCore) Enabled(zapcore.Level) bool { return true }

func (c *logCore) With(f []zapcore.Field) zapcore.Core {
	return &logCore{ch: c.ch, fields: append(slices.Clone(c.fields), f...)}
}

func (c *logCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, c)
}

func (c *logCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, x := range append(slices.Clone(c.fields), f...) {
		x.AddTo(enc)
	}
	select {
	case c.ch <- fmt.Sprint(e.Message, " ", enc.Fields):
	default:
	}
	return nil
}

func (c *logCore) Sync() error { return nil }

// TestPythonDials: the Python node dials the Go node's control connection
// (mesh membership: both ends dial), so it joins a Go node that starts
// after it and rejoins one that restarts. The Go node's config gives the
// Python node an address where nothing listens: only the Python node's
// dials can connect the two.
func TestPythonDials(t *testing.T) {
	cfg, err := config.LocalConfig("pydial", 2)
	if err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, cfg, 1, 0)
	goCfg := *cfg
	goCfg.Nodes = slices.Clone(cfg.Nodes)
	goCfg.Nodes[1].Address = closedAddress(t)
	py := cfg.Nodes[1].Name
	for run := 0; run < 2; run++ {
		// The Python node is dialing (and failing) when the Go node starts.
		node := startGo(t, &goCfg, zap.NewNop())
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := node.WaitPeer(ctx, py); err != nil {
			t.Fatalf("run %d: the Go node did not see the Python node up: %v", run, err)
		}
		p.do("wait", "ok wait")
		want := fmt.Sprintf("conn dialed by %s incarnation %d", py, node.Incarnation())
		if l := p.do("conn", "conn"); l != want {
			t.Fatalf("run %d: python node: %q, want %q", run, l, want)
		}
		// Messages both ways over the connection the Python node dialed.
		xt, err := tensor.FromFloat32s([]float32{1, -2, 3.5}, tensor.Shape{3})
		if err != nil {
			t.Fatal(err)
		}
		res, err := node.Request(ctx, node.PID(py, "double"), &Vec{Scale: 1, X: xt})
		if v, ok := res.(*Vec); err != nil || !ok || fmt.Sprint(v.X.Float32s()) != "[2 -4 7]" {
			t.Fatalf("run %d: request to python: %#v, %v", run, res, err)
		}
		p.do("request 5", "ok request")
		cancel()
		// The Go node restarts (a new incarnation, on the same address).
		if err := node.Stop(); err != nil {
			t.Fatal(err)
		}
		p.expectLine("down " + cfg.Nodes[0].Name)
	}
	// Nothing went wrong but the Go node's goodbyes.
	var errs []string
	if err := json.Unmarshal([]byte(strings.TrimPrefix(p.do("errors", "errors"), "errors ")), &errs); err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		if !strings.Contains(e, "said goodbye: node "+cfg.Nodes[0].Name+" shutting down") {
			t.Fatalf("python node's errors: %q", errs)
		}
	}
}

// closedAddress returns a loopback address where nothing listens.
func closedAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestPythonEtcd runs Go nodes with etcd discovery (one on membership:
// mesh; two on gossip, which gossip among themselves) and a Python node
// registered in the same etcd, none named in another's config: they find
// each other, requests go both ways, and the Python node's stop is a
// NodeDown on the Go side (issue 33).
func TestPythonEtcd(t *testing.T) {
	py := python(t)
	for _, tc := range []struct {
		membership string
		goNodes    int
	}{{config.MembershipMesh, 1}, {config.MembershipGossip, 2}} {
		t.Run(tc.membership, func(t *testing.T) { pythonEtcd(t, py, tc.membership, tc.goNodes) })
	}
}

// pythonEtcd runs goNodes Go nodes on membership with etcd discovery, each
// config listing only itself, and a Python node that finds them in etcd
// (under gossip, as a mesh_only node: it registers the mark, and the
// gossiping nodes keep a mesh connection to it).
func pythonEtcd(t *testing.T, py, membership string, goNodes int) {
	etcd := etcdtest.Start(t)
	cfg, err := config.LocalConfig("pyetcd", goNodes+1)
	if err != nil {
		t.Fatal(err)
	}
	pyName := cfg.Nodes[goNodes].Name
	downs := make(chan *cluster.NodeDown, 8)
	var nodes []*actor.Node
	for i := range goNodes {
		goCfg := *cfg
		goCfg.Nodes = []config.NodeConfig{cfg.Nodes[i]}
		goCfg.Membership = membership
		goCfg.Discovery = &config.DiscoveryConfig{Etcd: &config.EtcdConfig{Endpoints: []string{etcd.ClientURL}, LeaseTTL: 2 * time.Second}}
		if err := goCfg.Validate(); err != nil {
			t.Fatal(err)
		}
		node := startGo(t, &goCfg, zap.NewNop())
		sub := node.System().EventStream.Subscribe(func(ev any) {
			if d, ok := ev.(*cluster.NodeDown); ok && d.Node == pyName {
				downs <- d
			}
		})
		defer node.System().EventStream.Unsubscribe(sub)
		nodes = append(nodes, node)
	}
	node := nodes[0]
	conf := peerConfig(cfg, nil, goNodes, 0)
	conf["peers"] = map[string]any{} // it learns the Go nodes from etcd
	conf["membership"], conf["mesh_only"] = membership, membership == config.MembershipGossip
	conf["discovery"] = map[string]any{"etcd": map[string]any{
		"endpoints": []string{etcd.ClientURL}, "prefix": config.DefaultEtcdConfig().Prefix, "lease_ttl": 2}}
	p := runPeer(t, py, conf)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, n := range nodes {
		if err := n.WaitPeer(ctx, pyName); err != nil {
			t.Fatalf("%s did not see the Python node up: %v", n.Name(), err)
		}
	}
	p.do("wait", "ok wait")
	// Go -> Python, inline and above the inline threshold (staging).
	for _, n := range []int{3, int(cfg.Transport.InlineThreshold)/4 + 5} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i % 7)
		}
		xt, err := tensor.FromFloat32s(x, tensor.Shape{int64(n)})
		if err != nil {
			t.Fatal(err)
		}
		res, err := node.Request(ctx, node.PID(pyName, "double"), &Vec{Scale: 1, X: xt})
		v, ok := res.(*Vec)
		if err != nil || !ok {
			t.Fatalf("request of %d elements to python: %#v, %v", n, res, err)
		}
		got := v.X.Float32s()
		for i := range x {
			if got[i] != 2*x[i] {
				t.Fatalf("request of %d elements: element %d is %v, want %v", n, i, got[i], 2*x[i])
			}
		}
	}
	// Python -> Go.
	p.do("request 5", "ok request")
	p.do("big", "ok big")
	// The Python node stops: deregistered, down at every Go node.
	p.do("quit", "stopped")
	for range nodes {
		select {
		case d := <-downs:
			t.Logf("down: %s", d.Reason)
		case <-ctx.Done():
			t.Fatal("no NodeDown of the Python node at a Go node")
		}
	}
}
