package actor_test

import (
	"context"
	"expvar"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/cluster"
	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

var (
	soakFlag     = flag.Duration("soak", 0, "how long TestSoakNodeKills kills and restarts nodes under traffic (0: $TF_SOAK, else 45s for each membership)")
	soakSeedFlag = flag.Uint64("soak.seed", 0, "seed of TestSoakNodeKills's schedule (0: $TF_SOAK_SEED, else from the clock)")
)

// defaultSoak keeps the whole test (setup and settling included) near two
// minutes under -race on two cores.
const defaultSoak = 90 * time.Second

// SoakWatch asks a child's soakwatch actor to watch (On) or unwatch the
// actor ID of node Node; it answers with a Pong.
type SoakWatch struct {
	Node, ID string
	On       bool
}

// SoakGen asks a child's soakgen actor for a float32 tensor of Elems random
// elements; it answers with a SoakTensor (the tensor is lent to the asker).
type SoakGen struct {
	Elems int
	Seed  uint64
}

// SoakTensor is a tensor and the FNV-1a hash of its bytes.
type SoakTensor struct {
	Hash uint64
	W    *tensor.Tensor
}

func init() {
	actor.MustRegisterMessage("test.SoakWatch", &SoakWatch{})
	actor.MustRegisterMessage("test.SoakGen", &SoakGen{})
	actor.MustRegisterMessage("test.SoakTensor", &SoakTensor{})
}

// TestHelperSoakNode is not a test: it is the body of a child node of
// TestSoakNodeKills (the test binary re-executes itself). It runs the actors
// of the process tests and the soak's own.
func TestHelperSoakNode(t *testing.T) {
	node := nodeOfChild(t, "TF_SOAK_CONFIG", "TF_SOAK_NODE", "runs only as a child process of TestSoakNodeKills")
	name := node.Name()
	spawnTestActors(node)
	_, _ = node.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if m, ok := c.Message().(*SoakWatch); ok {
			if pid := pa.NewPID(m.Node, m.ID); m.On {
				c.Watch(pid)
			} else {
				c.Unwatch(pid)
			}
			c.Respond(&Pong{From: name})
		}
	}), "soakwatch")
	_, _ = node.Root().SpawnNamed(pa.PropsFromFunc(func(c pa.Context) {
		if m, ok := c.Message().(*SoakGen); ok {
			x, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{int64(m.Elems)})
			if err != nil {
				c.Respond(&Digest{Err: err.Error()})
				return
			}
			rng := rand.New(rand.NewPCG(m.Seed, 1))
			b := x.Host()
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			c.Respond(&SoakTensor{Hash: fnvHash(b), W: x})
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				if x.WaitReleased(ctx) == nil {
					_ = x.Free()
				}
			}()
		}
	}), "soakgen")
	serveChild(node)
}

func fnvHash(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func soakDuration(t *testing.T) time.Duration {
	if *soakFlag > 0 {
		return *soakFlag
	}
	if s := os.Getenv("TF_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("TF_SOAK=%q: want a positive duration", s)
		}
		return d
	}
	return defaultSoak
}

func soakSeed(t *testing.T) uint64 {
	if *soakSeedFlag != 0 {
		return *soakSeedFlag
	}
	if s := os.Getenv("TF_SOAK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TF_SOAK_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// soakMembers follows the parent's NodeUp and NodeDown events: which
// incarnation of each child it sees up. Every wait of the soak on the
// cluster's state waits here, for an event.
type soakMembers struct {
	mu      sync.Mutex
	up      map[string]uint64 // node → incarnation, while up
	changed chan struct{}     // closed and replaced at every event
	ups     int
	downs   int
}

func newSoakMembers() *soakMembers {
	return &soakMembers{up: map[string]uint64{}, changed: make(chan struct{})}
}

// event is the EventStream subscriber: it must not block.
func (m *soakMembers) event(ev any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e := ev.(type) {
	case *cluster.NodeUp:
		m.up[e.Node] = e.Incarnation
		m.ups++
	case *cluster.NodeDown:
		if m.up[e.Node] == e.Incarnation {
			delete(m.up, e.Node)
		}
		m.downs++
	default:
		return
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// incarnation returns the incarnation of node seen up, or 0.
func (m *soakMembers) incarnation(node string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.up[node]
}

// upNodes returns the nodes seen up and a channel closed at the next event.
func (m *soakMembers) upNodes() ([]string, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for n := range m.up {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, m.changed
}

// wait blocks until ok holds for the state, failing the test after guard.
func (m *soakMembers) wait(t *testing.T, what string, guard time.Duration, ok func(up map[string]uint64) bool) {
	t.Helper()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		done, ch := ok(m.up), m.changed
		m.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("soak: no event within %v: %s", guard, what)
		}
	}
}

// soakChild is one incarnation of a child node's process.
type soakChild struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process exited
}

func startSoakChild(t *testing.T, cfgPath, name string) *soakChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSoakNode$", "-test.v=false")
	cmd.Env = append(os.Environ(), "TF_SOAK_CONFIG="+cfgPath, "TF_SOAK_NODE="+name)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &soakChild{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	})
	return c
}

// waitExit waits for the process to end after a SIGKILL.
func (c *soakChild) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("soak: %s (pid %d) did not exit after SIGKILL", c.name, c.cmd.Process.Pid)
	}
}

// soakFigures is what the soak compares before and after.
type soakFigures struct {
	goroutines  int
	stacks      map[string]int // goroutine's function and creator → count
	fds         int
	heapInuse   uint64
	hostCached  int
	stats       actor.StatsSnapshot
	watches     int // this node's watches on remote actors
	remoteWatch int // watches the children hold on this node's actors
	requests    int // Request calls waiting for a reply
	regcaches   map[string]memory.RegStats
}

func (f soakFigures) String() string {
	var rc []string
	for name, s := range f.regcaches {
		rc = append(rc, fmt.Sprintf("%s{registered %d, in use %d, bytes %d}", name, s.Registered, s.InUse, s.Bytes))
	}
	sort.Strings(rc)
	return fmt.Sprintf("goroutines %d, fds %d, heap in use %.1f MiB (host cache %.1f MiB), exports %d, budget in use %d, watches %d, remote watches %d, waiting requests %d, regcaches [%s]",
		f.goroutines, f.fds, float64(f.heapInuse)/(1<<20), float64(f.hostCached)/(1<<20),
		f.stats.Exports, f.stats.BudgetInUse, f.watches, f.remoteWatch, f.requests, strings.Join(rc, " "))
}

func measureSoak(t *testing.T, n *actor.Node, children []string) soakFigures {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := soakFigures{heapInuse: ms.HeapInuse, stats: n.Stats(), watches: actor.WatchCount(n),
		requests: actor.WaitingRequests(n), regcaches: map[string]memory.RegStats{}}
	f.hostCached, _ = memory.HostCacheStats()
	for _, c := range children {
		f.remoteWatch += actor.RemoteWatches(n, c)
	}
	f.goroutines, f.stacks = goroutineStacks()
	f.fds = openFDs(t)
	// The registration caches publish themselves with expvar.
	expvar.Do(func(kv expvar.KeyValue) {
		if name, ok := strings.CutPrefix(kv.Key, "tensorferry.regcache."); ok {
			f.regcaches[name] = memory.RegCacheStats(name)
		}
	})
	return f
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("soak: counting open fds: %v", err)
	}
	return len(ents) - 1 // the directory being read
}

// goroutineStacks returns the number of goroutines and, goleak-style, a
// count per (function at the top of the stack, creator).
func goroutineStacks() (int, map[string]int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]int{}
	total := 0
	for _, g := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
		lines := strings.Split(g, "\n")
		if len(lines) < 2 {
			continue
		}
		top := lines[1]
		if i := strings.LastIndexByte(top, '('); i > 0 {
			top = top[:i]
		}
		creator := ""
		for _, l := range lines {
			if c, ok := strings.CutPrefix(l, "created by "); ok {
				creator = c
				if i := strings.Index(creator, " in goroutine"); i > 0 {
					creator = creator[:i]
				}
			}
		}
		// protoactor's dead-letter throttle outlives its interval (see
		// TestMain); the goroutine reading the stacks is not the node's.
		if strings.Contains(top, "NewThrottle") || strings.Contains(creator, "NewThrottle") ||
			strings.HasPrefix(top, "runtime.Stack") || strings.HasPrefix(top, "runtime/pprof") {
			continue
		}
		out[top+" ← "+creator]++
		total++
	}
	return total, out
}

func stackDiff(before, after map[string]int) string {
	var lines []string
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			lines = append(lines, fmt.Sprintf("%+d %s", d, k))
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok {
			lines = append(lines, fmt.Sprintf("%+d %s", -v, k))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// soakCounts counts the outcomes of one kind of traffic.
type soakCounts struct{ ok, failed atomic.Int64 }

func (c *soakCounts) add(err error) {
	if err != nil {
		c.failed.Add(1)
	} else {
		c.ok.Add(1)
	}
}

func (c *soakCounts) String() string {
	return fmt.Sprintf("%d ok, %d failed", c.ok.Load(), c.failed.Load())
}

// soakTraffic is the parent's traffic to its children: requests to echo
// actors, tensors above the inline threshold both ways (fetched over
// staging), Refs (direct and forwarded to another child) and watches both
// ways.
type soakTraffic struct {
	t       *testing.T
	n       *actor.Node
	members *soakMembers
	targets []string // actors of the parent the children watch
	refTTL  time.Duration
	stop    chan struct{}

	echo, grad, ref, gen, watchOut, watchIn soakCounts
	lateReleases                            atomic.Int64 // leases that outlived their request
}

const soakRequestTimeout = 15 * time.Second

func (s *soakTraffic) run(id int, rng *rand.Rand) {
	for i := 0; ; i++ {
		select {
		case <-s.stop:
			return
		default:
		}
		up, changed := s.members.upNodes()
		var kids []string
		for _, n := range up {
			if n != s.n.Name() {
				kids = append(kids, n)
			}
		}
		if len(kids) == 0 {
			select {
			case <-s.stop:
				return
			case <-changed:
			}
			continue
		}
		child := kids[rng.IntN(len(kids))]
		switch rng.IntN(7) {
		case 0, 1:
			s.doEcho(child, id<<32|i)
		case 2:
			s.doGrad(child, rng)
		case 3:
			other := kids[rng.IntN(len(kids))]
			s.doRef(child, other, rng)
		case 4:
			s.doGen(child, rng)
		case 5:
			s.doWatchOut(child, id<<32|i)
		case 6:
			s.doWatchIn(child, s.targets[rng.IntN(len(s.targets))], id<<32|i)
		}
	}
}

func (s *soakTraffic) request(pid *pa.PID, msg any) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), soakRequestTimeout)
	defer cancel()
	return s.n.Request(ctx, pid, msg)
}

func (s *soakTraffic) doEcho(child string, n int) {
	res, err := s.request(s.n.PID(child, "echo"), &Ping{N: n})
	if err == nil {
		if p, ok := res.(*Pong); !ok || p.N != n || p.From != child {
			s.t.Errorf("soak: echo of %s: got %#v for Ping %d", child, res, n)
		}
	}
	s.echo.add(err)
}

// soakTensor returns a random float32 tensor above the inline threshold
// (64 KiB) and up to about 1 MiB, and the hash of its bytes.
func (s *soakTraffic) soakTensor(rng *rand.Rand) (*tensor.Tensor, uint64) {
	x, err := tensor.New(memory.CPU, tensor.Float32, tensor.Shape{int64(20000 + rng.IntN(240000))})
	if err != nil {
		s.t.Fatal(err)
	}
	b := x.Host()
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return x, fnvHash(b)
}

// released waits until every lease on x ended (the receiver released it,
// or its node went down, or the lease expired), then frees it.
func (s *soakTraffic) released(x *tensor.Tensor, what string, guard time.Duration) {
	select {
	case <-x.Released():
	default:
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		if err := x.WaitReleased(ctx); err != nil {
			s.t.Errorf("soak: %s: %v leased %v after the request ended", what, x, guard)
			return
		}
		if time.Since(start) > soakRequestTimeout {
			s.lateReleases.Add(1)
		}
	}
	if err := x.Free(); err != nil {
		s.t.Errorf("soak: %s: free: %v", what, err)
	}
}

func (s *soakTraffic) checkDigest(what string, res any, hash uint64) error {
	d, ok := res.(*Digest)
	switch {
	case !ok:
		s.t.Errorf("soak: %s: reply %T %v", what, res, res)
		return fmt.Errorf("bad reply")
	case d.Err != "":
		return fmt.Errorf("%s", d.Err) // the fetch failed: a node went down
	case d.Hash != hash:
		s.t.Errorf("soak: %s: received hash %x, sent %x", what, d.Hash, hash)
	}
	return nil
}

func (s *soakTraffic) doGrad(child string, rng *rand.Rand) {
	x, h := s.soakTensor(rng)
	res, err := s.n.Root().RequestFuture(s.n.PID(child, "tensors"), &Grad{W: x}, soakRequestTimeout).Result()
	if err == nil {
		err = s.checkDigest("Grad to "+child, res, h)
	}
	s.grad.add(err)
	s.released(x, "Grad to "+child, 30*time.Second)
}

func (s *soakTraffic) doRef(child, other string, rng *rand.Rand) {
	x, h := s.soakTensor(rng)
	var msg any = &RefMsg{R: tensor.NewRef(x)}
	what := "Ref to " + child
	if other != child {
		msg = &ForwardRef{R: tensor.NewRef(x), Next: other}
		what = "Ref to " + child + " forwarded to " + other
	}
	res, err := s.n.Root().RequestFuture(s.n.PID(child, "tensors"), msg, soakRequestTimeout).Result()
	if err == nil {
		err = s.checkDigest(what, res, h)
	}
	s.ref.add(err)
	// A Ref forwarded to a node that went down stays lent to the live
	// first holder until its TTL.
	s.released(x, what, s.refTTL+30*time.Second)
}

func (s *soakTraffic) doGen(child string, rng *rand.Rand) {
	res, err := s.request(s.n.PID(child, "soakgen"), &SoakGen{Elems: 20000 + rng.IntN(240000), Seed: rng.Uint64()})
	if err == nil {
		if m, ok := res.(*SoakTensor); !ok {
			s.t.Errorf("soak: SoakGen to %s: reply %T %v", child, res, res)
		} else {
			if got := fnvHash(m.W.Host()); got != m.Hash {
				s.t.Errorf("soak: tensor from %s: hash %x, sent %x", child, got, m.Hash)
			}
			_ = m.W.Free()
		}
	}
	s.gen.add(err)
}

// doWatchOut watches a child's echo actor from a short-lived actor here,
// which unwatches as it stops.
func (s *soakTraffic) doWatchOut(child string, n int) {
	target := s.n.PID(child, "echo")
	started := make(chan struct{})
	props := pa.PropsFromFunc(func(c pa.Context) {
		switch c.Message().(type) {
		case *pa.Started:
			c.Watch(target)
			close(started)
		case *pa.Stopping:
			c.Unwatch(target)
		}
	})
	w := s.n.Root().Spawn(props)
	select {
	case <-started:
	case <-time.After(soakRequestTimeout):
		s.t.Errorf("soak: watcher of %s did not start", child)
		return
	}
	_, err := s.request(target, &Ping{N: n})
	s.watchOut.add(err)
	if err := s.n.Root().StopFuture(w).Wait(); err != nil {
		s.t.Errorf("soak: stopping the watcher of %s: %v", child, err)
	}
}

// doWatchIn has a child's actor watch one of the parent's, then unwatch it.
func (s *soakTraffic) doWatchIn(child, target string, n int) {
	pid := s.n.PID(child, "soakwatch")
	_, err := s.request(pid, &SoakWatch{Node: s.n.Name(), ID: target, On: true})
	if err == nil {
		_, err = s.request(s.n.PID(child, "echo"), &Ping{N: n})
	}
	if _, uerr := s.request(pid, &SoakWatch{Node: s.n.Name(), ID: target}); err == nil {
		err = uerr
	}
	s.watchIn.add(err)
}

// TestSoakNodeKills runs a parent node here and three child nodes in other
// processes of one loopback cluster with traffic all the time, kills
// children at random (SIGKILL, or SIGSTOP until the parent declares them
// down and then SIGKILL) and restarts them, and checks that the parent's
// resources return to what they were before the traffic. -soak sets how
// long (or $TF_SOAK), -soak.seed replays a schedule (or $TF_SOAK_SEED): the
// seed fixes the kills, the signals, the pauses and the traffic each worker
// picks, not how the processes interleave.
// TestSoakNodeKills runs the soak with each membership: the full mesh and
// gossip. By default each gets half of defaultSoak; -soak or $TF_SOAK sets
// each one's duration.
func TestSoakNodeKills(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: kills and restarts processes for minutes")
	}
	dur, seed := soakDuration(t), soakSeed(t)
	if *soakFlag == 0 && os.Getenv("TF_SOAK") == "" {
		dur /= 2
	}
	for _, mode := range []string{config.MembershipMesh, config.MembershipGossip} {
		t.Run(mode, func(t *testing.T) { soakNodeKills(t, mode, dur, seed) })
	}
}

// soakNodeKills kills and restarts three child nodes for dur under traffic
// from the parent, with the given membership, then checks the parent is
// back where it started.
func soakNodeKills(t *testing.T, membership string, dur time.Duration, seed uint64) {
	t.Logf("soak: %s, seed %d, %v of kills (replay with -soak.seed %d or TF_SOAK_SEED=%d)", membership, seed, dur, seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	start := time.Now()

	const nodes = 4 // the parent and three children
	cfg, err := config.LocalConfig("soak", nodes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Membership = membership
	// With gossip, a control connection is dialed by the first message:
	// kept open through the soak, so that NodeUp and NodeDown mean what
	// they mean with the mesh.
	cfg.Transport.IdleTimeout = time.Hour
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	path, err := cfg.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, nc := range cfg.Nodes {
		names = append(names, nc.Name)
	}
	kids := names[1:]
	// A forwarded Ref whose second node died stays lent to the first until
	// its TTL: short enough to end within the soak.
	const refTTL = 20 * time.Second
	parent, err := actor.NewNode(cfg, names[0], testLogger(), actor.WithRefTTL(refTTL))
	if err != nil {
		t.Fatal(err)
	}
	members := newSoakMembers()
	sub := parent.System().EventStream.Subscribe(members.event)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Stop() })
	t.Cleanup(func() { parent.System().EventStream.Unsubscribe(sub) })
	spawnTestActors(parent)
	targets := []string{"soak-target-0", "soak-target-1", "soak-target-2"}
	for _, id := range targets {
		if _, err := parent.Root().SpawnNamed(pa.PropsFromFunc(func(pa.Context) {}), id); err != nil {
			t.Fatal(err)
		}
	}

	children := map[string]*soakChild{}
	for _, name := range kids {
		children[name] = startSoakChild(t, path, name)
	}
	// dial has the parent dial name, with gossip (the mesh dials every
	// node itself); the wait for NodeUp that follows reports a failure.
	var dials sync.WaitGroup
	t.Cleanup(dials.Wait)
	dial := func(name string) {
		if membership != config.MembershipGossip {
			return
		}
		dials.Add(1)
		go func() {
			defer dials.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = parent.WaitPeer(ctx, name)
		}()
	}
	allUp := func(what string) {
		t.Helper()
		for _, name := range kids {
			dial(name)
		}
		members.wait(t, what, 30*time.Second, func(up map[string]uint64) bool { return len(up) == len(kids) })
		// Every child sees every node too.
		for _, name := range kids {
			res, err := parent.Root().RequestFuture(parent.PID(name, "tensors"), &WaitPeers{Nodes: names}, 30*time.Second).Result()
			if err != nil || res.(*Digest).Err != "" {
				t.Fatalf("soak: %s waiting for its peers (%s): %v %v", name, what, res, err)
			}
		}
	}
	allUp("every child up at the start")
	baseline := measureSoak(t, parent, kids)
	t.Logf("soak: baseline: %v", baseline)

	traffic := &soakTraffic{t: t, n: parent, members: members, targets: targets, refTTL: refTTL, stop: make(chan struct{})}
	var wg sync.WaitGroup
	const workers = 6
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			traffic.run(i, rand.New(rand.NewPCG(seed, uint64(i+1))))
		}()
	}
	stopped := false
	stopTraffic := func() {
		if stopped {
			return
		}
		stopped = true
		close(traffic.stop)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(refTTL + 2*time.Minute):
			t.Fatal("soak: the traffic did not stop")
		}
	}
	t.Cleanup(stopTraffic) // a failed test stops its workers too

	// Kill and restart children at random: a step restarts a dead child or
	// kills a live one (at most two are down at once).
	kill := func(name string) {
		c, inc := children[name], members.incarnation(name)
		how := "SIGKILL"
		if rng.IntN(2) == 0 {
			how = "SIGSTOP+SIGKILL"
			_ = c.cmd.Process.Signal(syscall.SIGSTOP)
			members.wait(t, name+" declared down after SIGSTOP", cfg.FailureTimeout+20*time.Second,
				func(up map[string]uint64) bool { return up[name] != inc })
		}
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		c.waitExit(t)
		members.wait(t, name+" down after "+how, 20*time.Second,
			func(up map[string]uint64) bool { return up[name] != inc })
		t.Logf("soak: %5.1fs %s %s (incarnation %d)", time.Since(start).Seconds(), how, name, inc)
		children[name] = nil
	}
	restart := func(name string, old uint64) {
		children[name] = startSoakChild(t, path, name)
		dial(name)
		members.wait(t, name+" up again", 30*time.Second,
			func(up map[string]uint64) bool { return up[name] != 0 && up[name] != old })
	}
	kills := 0
	lastInc := map[string]uint64{}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		// The pause between steps is load shaping drawn from the seeded
		// RNG, not synchronization: every step waits for its own events.
		pause := time.NewTimer(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
		<-pause.C
		var dead []string
		for _, name := range kids {
			if children[name] == nil {
				dead = append(dead, name)
			}
		}
		name := kids[rng.IntN(len(kids))]
		if children[name] != nil && len(dead) >= 2 {
			name = dead[rng.IntN(len(dead))]
		}
		if children[name] != nil {
			lastInc[name] = members.incarnation(name)
			kill(name)
			kills++
		} else {
			restart(name, lastInc[name])
			t.Logf("soak: %5.1fs restarted %s (incarnation %d)", time.Since(start).Seconds(), name, members.incarnation(name))
		}
	}
	for _, name := range kids {
		if children[name] == nil {
			restart(name, lastInc[name])
		}
	}
	killsEnd := time.Since(start)
	stopTraffic()
	t.Logf("soak: kills ended at %.1fs, traffic stopped at %.1fs", killsEnd.Seconds(), time.Since(start).Seconds())
	t.Logf("soak: %d kills in %v; echo %v; tensors sent %v; Refs %v; tensors received %v; watches out %v; watches in %v; leases released after their request's timeout %d; NodeUp %d, NodeDown %d",
		kills, time.Since(start).Round(time.Second), &traffic.echo, &traffic.grad, &traffic.ref, &traffic.gen,
		&traffic.watchOut, &traffic.watchIn, traffic.lateReleases.Load(), members.ups, members.downs)
	for _, c := range []*soakCounts{&traffic.echo, &traffic.grad, &traffic.ref, &traffic.gen, &traffic.watchOut, &traffic.watchIn} {
		if c.ok.Load() == 0 {
			t.Errorf("soak: a kind of traffic never succeeded: %v", c)
		}
	}

	// Settled with every child up and the traffic stopped: nothing is lent,
	// fetched, watched or waited for.
	allUp("every child up after the kills")
	warm := measureSoak(t, parent, kids)
	t.Logf("soak: after the traffic (children up, their data connections cached): %v", warm)
	if warm.stats.Exports != 0 || warm.stats.BudgetInUse != 0 || warm.watches != 0 || warm.remoteWatch != 0 || warm.requests != 0 {
		t.Errorf("soak: left after the traffic: %v", warm)
	}

	// Restart every child once more, so that the parent holds what it held
	// at the baseline: one fresh incarnation of each, no data connections.
	for _, name := range kids {
		inc := members.incarnation(name)
		_ = children[name].cmd.Process.Signal(syscall.SIGKILL)
		children[name].waitExit(t)
		members.wait(t, name+" down for the final restart", 20*time.Second,
			func(up map[string]uint64) bool { return up[name] != inc })
		restart(name, inc)
	}
	allUp("every child up after the final restart")

	// Goroutines and fds of dead connections end after the NodeDown that
	// closed them; like goleak, retry a bounded number of times before
	// calling them leaked.
	const goroutineSlack, fdSlack = 4, 2
	var after soakFigures
	tries := 0
	for ; ; tries++ {
		after = measureSoak(t, parent, kids)
		if (after.goroutines <= baseline.goroutines+goroutineSlack && after.fds <= baseline.fds+fdSlack) || tries == 50 {
			break
		}
		runtime.Gosched()
		time.Sleep(100 * time.Millisecond) // goleak's retry: nothing announces a goroutine's end
	}
	t.Logf("soak: after: %v (%d retries, %v in all)", after, tries, time.Since(start).Round(time.Second))
	if after.goroutines > baseline.goroutines+goroutineSlack {
		t.Errorf("soak: %d goroutines, %d at the baseline; by function ← creator:\n%s",
			after.goroutines, baseline.goroutines, stackDiff(baseline.stacks, after.stacks))
	}
	if after.fds > baseline.fds+fdSlack {
		t.Errorf("soak: %d open fds, %d at the baseline", after.fds, baseline.fds)
	}
	// The host buffer cache keeps freed tensor buffers for reuse; beyond it
	// the heap may grow by what the runtime and protoactor keep warm.
	const heapSlack = 16 << 20
	if limit := baseline.heapInuse + uint64(after.hostCached) + heapSlack; after.heapInuse > limit {
		t.Errorf("soak: heap in use %d bytes, limit %d (baseline %d + host cache %d + %d)",
			after.heapInuse, limit, baseline.heapInuse, after.hostCached, heapSlack)
	}
	if after.stats.Exports != 0 || after.stats.BudgetInUse != 0 || after.watches != 0 || after.remoteWatch != 0 || after.requests != 0 {
		t.Errorf("soak: left at the end: %v", after)
	}
	for name, s := range after.regcaches {
		b := baseline.regcaches[name]
		if s.Registered > b.Registered || s.InUse > b.InUse {
			t.Errorf("soak: regcache %s: %+v, baseline %+v", name, s, b)
		}
	}
}
