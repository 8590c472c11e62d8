package verbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// windowCluster is newCluster with memory windows forced (GrantWindows,
// bounds not probed) and the given owner budget; it skips where the device
// has no type-2 windows.
func windowCluster(t *testing.T, budget memory.RegBudget, names ...string) *cluster {
	t.Helper()
	cl := newClusterCfg(t, Config{Grants: GrantWindows, OwnerBudget: budget}, names...)
	if m, why := cl.chans[names[0]].Grants(); m != GrantWindows {
		t.Skipf("no memory windows: %s", why)
	}
	return cl
}

// probeVerdict is what GrantAuto concluded on this device: nil when windows
// confine reads to their range.
func probeVerdict(t *testing.T) error {
	t.Helper()
	m, why, err := GrantsOf(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("auto mode: %s (%s)", m, why)
	if m == GrantWindows {
		return nil
	}
	return errors.New(why)
}

// sliceTensor returns a tensor of n bytes at off of a fresh host allocation
// of size bytes (the allocation outlives the test).
func sliceTensor(t *testing.T, size, off, n int) *tensor.Tensor {
	t.Helper()
	base, err := memory.NewHostBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = base.Free() })
	b, err := base.Slice(off, n)
	if err != nil {
		t.Fatal(err)
	}
	tt, err := tensor.FromBuffer(b, tensor.Uint8, tensor.Shape{int64(n)})
	if err != nil {
		t.Fatal(err)
	}
	return tt
}

func hostBuf(t *testing.T, n int) memory.Buffer {
	t.Helper()
	b, err := memory.NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	return b
}

// TestGrantModeReported checks the mode and reason the channel reports, and
// that GrantAuto never picks windows whose bounds the probe found open.
func TestGrantModeReported(t *testing.T) {
	cl := newCluster(t, "owner")
	m, why := cl.chans["owner"].Grants()
	t.Logf("grants: %s (%s)", m, why)
	if m != GrantWindows && m != GrantRegister || why == "" {
		t.Fatalf("Grants() = %v, %q", m, why)
	}
	if m == GrantRegister && strings.Contains(why, "memory windows unusable") && !strings.Contains(why, "bounds not enforced") {
		t.Fatalf("windows refused for another reason than their bounds: %s", why)
	}
	forced := newClusterCfg(t, Config{Grants: GrantRegister}, "other")
	if m, why := forced.chans["other"].Grants(); m != GrantRegister || why != "configured" {
		t.Fatalf("GrantRegister configured: %v, %q", m, why)
	}
}

// TestWindowReadsExactlyItsRange exports 100 KiB in the middle of a 1 MiB
// allocation: the fetch and a raw read of exactly the granted range return
// its bytes, and a read one byte past its end fails where the device
// confines windows (GrantAuto's choice); where it does not, what the read
// did is logged.
func TestWindowReadsExactlyItsRange(t *testing.T) {
	cl := windowCluster(t, memory.RegBudget{}, "owner", "fetcher")
	const size, off, n = 1 << 20, 300 << 10, 100 << 10
	d, _ := cl.exportTensor(t, "owner", "fetcher", 11, sliceTensor(t, size, off, n))
	dst := hostBuf(t, n+1)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 11, n)
	addr, rkey := grantOf(t, cl, "fetcher", d)
	exact, _ := dst.Slice(0, n)
	if err := rawRead(t, cl, "fetcher", "owner", addr, rkey, exact); err != nil {
		t.Fatalf("read of exactly the window: %v", err)
	}
	checkData(t, dst.Host(), 11, n)
	if s := cl.chans["owner"].Stats(); s.WindowBinds != 1 || s.OwnerRegistrations != 1 {
		t.Errorf("owner stats %+v: want 1 window bound over 1 registration", s)
	}
	past, _ := dst.Slice(1, n)
	err := rawRead(t, cl, "fetcher", "owner", addr+1, rkey, past)
	verdict := probeVerdict(t)
	var wce *ibverbs.WCError
	switch {
	case errors.As(err, &wce):
		t.Logf("one byte past the window: %v", err)
	case err == nil && verdict != nil:
		t.Logf("OBSERVED: a read of [%d, %d) through a window bound to [0, %d) succeeded: this device does not enforce window bounds (GrantAuto: %v)", 1, n+1, n, verdict)
	default:
		t.Fatalf("one byte past the window: %v, want a work completion error", err)
	}
}

// TestPastRangeFailsInAutoMode reads one byte past an export in the mode
// GrantAuto picks: the read must fail whichever it is.
func TestPastRangeFailsInAutoMode(t *testing.T) {
	cl := newCluster(t, "owner", "fetcher")
	const size, off, n = 1 << 20, 300 << 10, 100 << 10
	d, _ := cl.exportTensor(t, "owner", "fetcher", 12, sliceTensor(t, size, off, n))
	dst := hostBuf(t, n)
	addr, rkey := grantOf(t, cl, "fetcher", d)
	err := rawRead(t, cl, "fetcher", "owner", addr+1, rkey, dst)
	var wce *ibverbs.WCError
	if !errors.As(err, &wce) {
		m, why := cl.chans["owner"].Grants()
		t.Fatalf("%s (%s): one byte past the export: %v, want a work completion error", m, why, err)
	}
	t.Logf("one byte past the export: %v", err)
}

// TestWindowReleasedAndForeignRKeys: a released export's window rkey reads
// nothing while its registration stays, and another peer's rkey reads
// nothing through that peer's queue pair.
func TestWindowReleasedAndForeignRKeys(t *testing.T) {
	cl := windowCluster(t, memory.RegBudget{}, "owner", "fetcher", "mallory")
	const n = 64 << 10
	d, tt := cl.export(t, "owner", "fetcher", 13, n)
	dm, _ := cl.export(t, "owner", "mallory", 14, n)
	dst := hostBuf(t, n)
	if err := cl.chans["mallory"].Fetch(fetchCtx(t), dm, dst); err != nil {
		t.Fatal(err)
	}
	addr, rkey := grantOf(t, cl, "fetcher", d)
	var wce *ibverbs.WCError
	if err := rawRead(t, cl, "mallory", "owner", addr, rkey, dst); !errors.As(err, &wce) {
		t.Fatalf("mallory reading with the fetcher's window rkey: %v, want a work completion error", err)
	} else {
		t.Logf("other peer's window rkey: %v", err)
	}
	if err := rawRead(t, cl, "fetcher", "owner", addr, rkey, dst); err != nil {
		t.Fatalf("the fetcher's own rkey: %v", err)
	}
	checkData(t, dst.Host(), 13, n)
	if err := cl.envs["owner"].Store.Release(d.ExportID, d.Lease); err != nil {
		t.Fatal(err)
	}
	if err := rawRead(t, cl, "fetcher", "owner", addr, rkey, dst); !errors.As(err, &wce) {
		t.Fatalf("a released export's window rkey: %v, want a work completion error", err)
	} else {
		t.Logf("released export's window rkey: %v", err)
	}
	s := cl.chans["owner"].Stats()
	if s.WindowInvalidations < 1 || s.OwnerDeregistrations != 0 {
		t.Errorf("owner stats %+v: want the window invalidated and the registrations kept", s)
	}
	// The allocation is still registered: exporting it again registers
	// nothing, and the fetcher (reconnecting after its failed read) reads it.
	d2, _ := cl.exportTensor(t, "owner", "fetcher", 15, tt)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d2, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 15, n)
	if s2 := cl.chans["owner"].Stats(); s2.OwnerRegistrations != s.OwnerRegistrations || s2.OwnerHits <= s.OwnerHits {
		t.Errorf("owner stats %+v then %+v: want a cache hit and no registration", s, s2)
	}
}

// TestWindowSecondTransferRegistersNothing: two exports of one allocation,
// one after the other, register it once.
func TestWindowSecondTransferRegistersNothing(t *testing.T) {
	cl := windowCluster(t, memory.RegBudget{}, "owner", "fetcher")
	const n = 200 << 10
	tt := sliceTensor(t, n, 0, n)
	dst := hostBuf(t, n)
	for i := range 3 {
		d, _ := cl.exportTensor(t, "owner", "fetcher", uint64(20+i), tt)
		if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
			t.Fatal(err)
		}
		checkData(t, dst.Host(), uint64(20+i), n)
		if err := cl.envs["owner"].Store.Release(d.ExportID, d.Lease); err != nil {
			t.Fatal(err)
		}
	}
	s := cl.chans["owner"].Stats()
	if s.OwnerRegistrations != 1 || s.OwnerHits != 2 || s.OwnerDeregistrations != 0 || s.WindowBinds != 3 || s.WindowInvalidations != 3 {
		t.Errorf("owner stats %+v: want 1 registration, 2 hits, 3 windows bound and invalidated", s)
	}
	if rs := memory.RegCacheStats("verbs-owner"); rs.Registered < 1 {
		t.Errorf("verbs-owner cache %+v: want the registration kept", rs)
	}
}

// TestWindowOwnerEviction: with room for one registration, a second
// allocation's export evicts the first (idle) one; one in use is kept.
func TestWindowOwnerEviction(t *testing.T) {
	cl := windowCluster(t, memory.RegBudget{Count: 1}, "owner", "fetcher")
	const n = 64 << 10
	dst := hostBuf(t, n)
	a, b := sliceTensor(t, n, 0, n), sliceTensor(t, n, 0, n)
	da, _ := cl.exportTensor(t, "owner", "fetcher", 30, a)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), da, dst); err != nil {
		t.Fatal(err)
	}
	// a is exported (in use): b's registration exceeds the budget but
	// evicts nothing in use.
	db, _ := cl.exportTensor(t, "owner", "fetcher", 31, b)
	if s := cl.chans["owner"].Stats(); s.OwnerDeregistrations != 0 || s.OwnerRegistrations != 2 {
		t.Fatalf("owner stats %+v: want 2 registrations and none evicted while in use", s)
	}
	if err := cl.envs["owner"].Store.Release(da.ExportID, da.Lease); err != nil {
		t.Fatal(err)
	}
	// a is idle now and over budget: evicted at its release.
	if s := cl.chans["owner"].Stats(); s.OwnerDeregistrations != 1 {
		t.Fatalf("owner stats %+v: want a's registration evicted", s)
	}
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), db, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 31, n)
	// a again: registered anew.
	da2, _ := cl.exportTensor(t, "owner", "fetcher", 32, a)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), da2, dst); err != nil {
		t.Fatal(err)
	}
	checkData(t, dst.Host(), 32, n)
	if s := cl.chans["owner"].Stats(); s.OwnerRegistrations != 3 {
		t.Errorf("owner stats %+v: want a registered again", s)
	}
}

// TestWindowPeerDeathDropsEverything: the owner's PeerDown drops the dead
// peer's registrations and windows; its rkey reads nothing afterwards.
func TestWindowPeerDeathDropsEverything(t *testing.T) {
	cl := windowCluster(t, memory.RegBudget{}, "owner", "fetcher")
	const n = 64 << 10
	d, _ := cl.export(t, "owner", "fetcher", 40, n)
	dst := hostBuf(t, n)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d, dst); err != nil {
		t.Fatal(err)
	}
	addr, rkey := grantOf(t, cl, "fetcher", d)
	before := memory.RegCacheStats("verbs-owner")
	cl.chans["owner"].PeerDown("fetcher")
	cl.chans["fetcher"].PeerDown("owner")
	s := cl.chans["owner"].Stats()
	if s.OwnerDeregistrations != 1 || s.WindowInvalidations < 1 {
		t.Errorf("owner stats %+v after PeerDown: want the registration and the window dropped", s)
	}
	if after := memory.RegCacheStats("verbs-owner"); after.Registered != before.Registered-1 {
		t.Errorf("verbs-owner cache %+v then %+v: want one registration fewer", before, after)
	}
	// The fetcher connects anew (a new protection domain on the owner):
	// the dead connection's rkey reads nothing.
	d2, _ := cl.export(t, "owner", "fetcher", 41, n)
	if err := cl.chans["fetcher"].Fetch(fetchCtx(t), d2, dst); err != nil {
		t.Fatal(err)
	}
	var wce *ibverbs.WCError
	err := rawRead(t, cl, "fetcher", "owner", addr, rkey, dst)
	if !errors.As(err, &wce) {
		t.Fatalf("a dead peer's window rkey: %v, want a work completion error", err)
	}
	t.Logf("dead peer's window rkey: %v", err)
}
