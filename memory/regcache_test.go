package memory

import (
	"errors"
	"expvar"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeRegistrar records registrations and fails on double registration of
// an allocation, like cuMemHostRegister does for memory already registered.
type fakeRegistrar struct {
	mu         sync.Mutex
	live       map[regKey]bool
	registers  int
	unregs     int
	fail       error         // next Register fails with it
	gate       chan struct{} // when set, Register waits for it
	doubleRegs int
}

type fakeReg struct {
	a    Allocation
	peer string
}

func (r *fakeReg) Allocation() Allocation { return r.a }

func newFake() *fakeRegistrar { return &fakeRegistrar{live: map[regKey]bool{}} }

func (f *fakeRegistrar) Register(a Allocation, _ string) (Registration, error) {
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail; err != nil {
		f.fail = nil
		return nil, err
	}
	k := regKey{a.ID, ""}
	if f.live[k] {
		f.doubleRegs++
		return nil, fmt.Errorf("fake: allocation %d already registered", a.ID)
	}
	f.live[k] = true
	f.registers++
	return &fakeReg{a: a}, nil
}

func (f *fakeRegistrar) Unregister(r Registration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := regKey{r.Allocation().ID, ""}
	if !f.live[k] {
		return fmt.Errorf("fake: allocation %d not registered", k.id)
	}
	delete(f.live, k)
	f.unregs++
	return nil
}

func (f *fakeRegistrar) counts() (registers, unregs, live int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registers, f.unregs, len(f.live)
}

func alloc(size int) Allocation {
	return Allocation{Device: CPU, Base: 0x1000, Size: size, ID: NextAllocationID()}
}

func TestRegCacheHitMissRelease(t *testing.T) {
	f := newFake()
	c := NewRegCache("t-hitmiss", f, RegBudget{})
	defer c.Close()
	a := alloc(100)
	r1, rel1, err := c.Get(a, "")
	if err != nil || r1.Allocation() != a {
		t.Fatalf("Get = %v, %v", r1, err)
	}
	r2, rel2, err := c.Get(a, "")
	if err != nil || r2 != r1 {
		t.Fatalf("second Get = %v, %v; want the same registration", r2, err)
	}
	rel1()
	rel1() // a second call does nothing
	rel2()
	r3, rel3, _ := c.Get(a, "")
	rel3()
	if r3 != r1 {
		t.Error("registration not kept after release")
	}
	if reg, unreg, _ := f.counts(); reg != 1 || unreg != 0 {
		t.Errorf("registers %d, unregisters %d; want 1, 0", reg, unreg)
	}
	st := c.Stats()
	if st.Hits != 2 || st.Misses != 1 || st.Registered != 1 || st.Bytes != 100 || st.InUse != 0 {
		t.Errorf("stats %+v", st)
	}
	v := expvar.Get("tensorferry.regcache.t-hitmiss")
	if v == nil || !strings.Contains(v.String(), `"Hits":2`) {
		t.Errorf("expvar = %v", v)
	}
}

func TestRegCacheEvictsLRUNotInUse(t *testing.T) {
	f := newFake()
	c := NewRegCache("t-evict", f, RegBudget{Count: 2, Bytes: 1000})
	defer c.Close()
	a, b, d := alloc(100), alloc(100), alloc(100)
	_, relA, _ := c.Get(a, "")
	_, relB, _ := c.Get(b, "")
	relB()
	relA() // a is now the most recently released
	_, relD, _ := c.Get(d, "")
	// Three registered, budget two: b (least recently released) goes.
	if _, _, live := f.counts(); live != 2 || f.live[regKey{b.ID, ""}] {
		t.Errorf("live %v; want a and d", f.live)
	}
	// In use: a and d both held, e registered on top: nothing idle to evict.
	_, relA, _ = c.Get(a, "")
	e := alloc(100)
	_, relE, _ := c.Get(e, "")
	if st := c.Stats(); st.Registered != 3 || st.Evictions != 1 {
		t.Errorf("with everything in use: %+v", st)
	}
	relE()
	// Over budget again, e is the only idle registration.
	if f.live[regKey{e.ID, ""}] {
		t.Error("idle e not evicted when over budget")
	}
	relA()
	relD()
	// Bytes budget.
	big := alloc(950)
	_, relBig, _ := c.Get(big, "")
	relBig()
	if st := c.Stats(); st.Bytes > 1000 || !f.live[regKey{big.ID, ""}] {
		t.Errorf("bytes budget: %+v, live %v", st, f.live)
	}
}

func TestRegCacheInvalidate(t *testing.T) {
	f := newFake()
	c := NewRegCache("t-inval", f, RegBudget{})
	defer c.Close()
	idle, busy := alloc(10), alloc(10)
	_, rel, _ := c.Get(idle, "")
	rel()
	if err := c.Invalidate(idle.ID); err != nil {
		t.Fatal(err)
	}
	if f.live[regKey{idle.ID, ""}] {
		t.Error("idle registration survived Invalidate")
	}
	_, relBusy, _ := c.Get(busy, "")
	c.Invalidate(busy.ID)
	if !f.live[regKey{busy.ID, ""}] {
		t.Error("in-use registration unregistered by Invalidate")
	}
	relBusy()
	if f.live[regKey{busy.ID, ""}] {
		t.Error("invalidated registration survived its last release")
	}
	st := c.Stats()
	if st.Invalidations != 2 || st.Registered != 0 || st.Bytes != 0 {
		t.Errorf("stats %+v", st)
	}
	// A new Get after Invalidate registers again.
	_, rel, _ = c.Get(busy, "")
	rel()
	if reg, _, _ := f.counts(); reg != 3 {
		t.Errorf("registers = %d, want 3", reg)
	}
}

func TestRegCacheFreeHook(t *testing.T) {
	f := newFake()
	c := NewRegCache("t-free", f, RegBudget{})
	defer c.Close()
	b, _ := NewHostBuffer(4096)
	_, rel, err := c.Get(b.Allocation(), "")
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if _, _, live := f.counts(); live != 0 {
		t.Error("freeing the buffer left it registered")
	}
	c.Close()
	w := WrapHost(make([]byte, 10))
	w.Free() // a closed cache no longer listens
	if st := c.Stats(); st.Invalidations != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestRegCacheDropPeer(t *testing.T) {
	f := &peerFake{live: map[regKey]bool{}}
	c := NewRegCache("t-peer", f, RegBudget{})
	defer c.Close()
	a := alloc(10)
	for _, p := range []string{"n1", "n2"} {
		_, rel, err := c.Get(a, p)
		if err != nil {
			t.Fatal(err)
		}
		rel()
	}
	_, relHeld, _ := c.Get(alloc(5), "n1")
	if st := c.Stats(); st.Misses != 3 || st.Registered != 3 {
		t.Fatalf("per-peer registrations: %+v", st)
	}
	c.DropPeer("n1")
	if len(f.live) != 2 || !f.live[regKey{a.ID, "n2"}] {
		t.Errorf("after DropPeer(n1): %v", f.live)
	}
	relHeld()
	if len(f.live) != 1 {
		t.Errorf("held n1 registration survived its release: %v", f.live)
	}
}

// peerFake makes one registration per (allocation, peer), like an RDMA
// memory region per protection domain.
type peerFake struct {
	mu   sync.Mutex
	live map[regKey]bool
}

func (f *peerFake) Register(a Allocation, peer string) (Registration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[regKey{a.ID, peer}] = true
	return &fakeReg{a: a, peer: peer}, nil
}

func (f *peerFake) Unregister(r Registration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fr := r.(*fakeReg)
	delete(f.live, regKey{fr.a.ID, fr.peer})
	return nil
}

// gets returns how many Gets c has counted (hits and misses).
func gets(c *RegCache) int64 {
	st := c.Stats()
	return st.Hits + st.Misses
}

// awaitGets waits until c has counted n Gets since it counted from: each
// has then either started the registration (held at the fake's gate) or
// waits for the pending one. Nothing reports that but the stats, so they
// are polled; the deadline only fails a test that never gets there.
func awaitGets(t *testing.T, c *RegCache, from int64, n int) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for gets(c) < from+int64(n) {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%d of %d Gets started", gets(c)-from, n)
		}
	}
}

func TestRegCacheErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	c := NewRegCache("t-err", f, RegBudget{})
	boom := errors.New("boom")
	f.fail = boom
	a := alloc(10)
	if _, _, err := c.Get(a, ""); !errors.Is(err, boom) {
		t.Fatalf("Get = %v, want boom", err)
	}
	// Not cached: the next Get registers.
	_, rel, err := c.Get(a, "")
	if err != nil {
		t.Fatal(err)
	}
	rel()
	// Waiters of a failing registration all get the error.
	f.gate = make(chan struct{})
	f.fail = boom
	b := alloc(10)
	gets0 := gets(c)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, rel, err := c.Get(b, "")
			if err == nil {
				rel()
			}
			errs[i] = err
		}()
	}
	awaitGets(t, c, gets0, len(errs))
	close(f.gate)
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if errors.Is(err, boom) {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no Get saw the registration error")
	}
	f.gate = nil
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Get(a, ""); !errors.Is(err, ErrCacheClosed) {
		t.Errorf("Get after Close = %v", err)
	}
	if _, _, live := f.counts(); live != 0 {
		t.Errorf("%d registrations left after Close", live)
	}
	if st := c.Stats(); st.RegisterErrors < 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRegCacheConcurrentSingleRegistration(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	f.gate = make(chan struct{})
	c := NewRegCache("t-single", f, RegBudget{})
	defer c.Close()
	a := alloc(1 << 20)
	gets0 := gets(c)
	var wg sync.WaitGroup
	regs := make([]Registration, 8)
	for i := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, rel, err := c.Get(a, "")
			if err != nil {
				t.Error(err)
				return
			}
			regs[i] = r
			rel()
		}()
	}
	awaitGets(t, c, gets0, len(regs))
	close(f.gate)
	wg.Wait()
	for _, r := range regs {
		if r != regs[0] {
			t.Fatal("concurrent Gets got different registrations")
		}
	}
	if reg, _, _ := f.counts(); reg != 1 {
		t.Errorf("registered %d times", reg)
	}
}

func TestRegCacheStress(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := newFake()
	c := NewRegCache("t-stress", f, RegBudget{Count: 5, Bytes: 600})
	allocs := make([]Allocation, 12)
	for i := range allocs {
		allocs[i] = alloc(50 + 10*i)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				a := allocs[r.IntN(len(allocs))]
				switch r.IntN(10) {
				case 0:
					c.Invalidate(a.ID)
				default:
					reg, rel, err := c.Get(a, "")
					if err != nil {
						t.Error(err)
						return
					}
					if reg.Allocation() != a {
						t.Error("wrong registration")
					}
					rel()
				}
			}
		}()
	}
	wg.Wait()
	st := c.Stats()
	if st.InUse != 0 || st.Registered > 5 || st.Bytes > 600 || st.UnregisterErrors != 0 {
		t.Errorf("after the storm: %+v", st)
	}
	_, _, live := f.counts()
	if int64(live) != st.Registered {
		t.Errorf("registrar holds %d, cache counts %d", live, st.Registered)
	}
	if f.doubleRegs != 0 {
		t.Errorf("%d registrations of an already registered allocation", f.doubleRegs)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, live := f.counts(); live != 0 {
		t.Errorf("%d left after Close", live)
	}
}

// slowUnreg blocks Unregister until released, to catch DropPeer returning
// while another goroutine is still unregistering one of the peer's entries.
type slowUnreg struct {
	peerFake
	entered chan struct{}
	release chan struct{}
}

func (s *slowUnreg) Unregister(r Registration) error {
	s.entered <- struct{}{}
	<-s.release
	return s.peerFake.Unregister(r)
}

func TestRegCacheDropPeerWaitsForConcurrentUnregister(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := &slowUnreg{peerFake: peerFake{live: map[regKey]bool{}}, entered: make(chan struct{}, 1), release: make(chan struct{})}
	c := NewRegCache("t-droppeer-wait", s, RegBudget{})
	defer c.Close()
	a := alloc(64)
	_, rel, err := c.Get(a, "p")
	if err != nil {
		t.Fatal(err)
	}
	rel()
	invalidated := make(chan error, 1)
	go func() { invalidated <- c.Invalidate(a.ID) }() // e.g. the allocation was freed
	<-s.entered                                       // Invalidate is inside Unregister now
	dropped := make(chan error, 1)
	go func() { dropped <- c.DropPeer("p") }()
	select {
	case <-dropped:
		t.Fatal("DropPeer returned while the peer's registration was still being unregistered")
	case <-time.After(50 * time.Millisecond):
	}
	close(s.release)
	if err := <-invalidated; err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) != 0 {
		t.Fatalf("%d registrations left", len(s.live))
	}
}

func TestPinBudgetHost(t *testing.T) {
	b, err := PinBudget(CPU)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := memlockLimit()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case lim > 1<<62 && b.Bytes != 0:
		t.Fatalf("unlimited memlock gave %+v", b)
	case lim <= 1<<62 && b.Bytes != int64(lim/4*3):
		t.Fatalf("memlock %d gave %+v, want three quarters", lim, b)
	}
	if _, err := PinBudget(Device{Kind: Kind(99)}); err == nil {
		t.Fatal("a budget for an unknown kind")
	}
	t.Logf("memlock %d: %+v", lim, b)
}
