package rdma

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

// emptyRegistry gives the test a registry of its own, restored at cleanup.
func emptyRegistry(t *testing.T) {
	t.Helper()
	registry.mu.Lock()
	saved := registry.sorted
	registry.sorted = nil
	registry.mu.Unlock()
	t.Cleanup(func() {
		registry.mu.Lock()
		registry.sorted = saved
		registry.mu.Unlock()
	})
}

type fakeChannel struct{ name string }

func (c *fakeChannel) Name() string { return c.name }
func (c *fakeChannel) Offer(context.Context, *tensor.Export, string) ([]byte, error) {
	return nil, nil
}
func (c *fakeChannel) Fetch(context.Context, *tensor.Descriptor, memory.Buffer) error { return nil }
func (c *fakeChannel) PeerDown(string)                                                {}
func (c *fakeChannel) Close() error                                                   { return nil }

func reachAll(_, _ *Caps, _, _ memory.Device) error { return nil }

func fake(name string, prio int) Backend {
	return Backend{Name: name, Priority: prio, Reach: reachAll,
		New: func(*Env) (Channel, error) { return &fakeChannel{name}, nil }}
}

func TestRegisterRejects(t *testing.T) {
	emptyRegistry(t)
	if err := Register(fake("a", 1)); err != nil {
		t.Fatal(err)
	}
	noNew := fake("b", 1)
	noNew.New = nil
	noReach := fake("c", 1)
	noReach.Reach = nil
	for _, tc := range []struct {
		b    Backend
		want string
	}{
		{fake("a", 2), "registered twice"},
		{fake("", 2), "backend name"},
		{fake("Bad Name", 2), "backend name"},
		{fake(strings.Repeat("x", 33), 2), "backend name"},
		{noNew, "needs Reach and New"},
		{noReach, "needs Reach and New"},
	} {
		if err := Register(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Register(%q) = %v, want an error with %q", tc.b.Name, err, tc.want)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("MustRegister of a duplicate did not panic")
			}
		}()
		MustRegister(fake("a", 3))
	}()
	if got := len(Backends()); got != 1 {
		t.Fatalf("%d backends after failed registrations, want 1", got)
	}
}

func TestBackendsOrder(t *testing.T) {
	emptyRegistry(t)
	for _, b := range []Backend{fake("z", 10), fake("b", 20), fake("a", 20), fake("y", 5)} {
		MustRegister(b)
	}
	var names []string
	for _, b := range Backends() {
		names = append(names, b.Name)
	}
	if want := []string{"y", "z", "a", "b"}; !slices.Equal(names, want) {
		t.Fatalf("Backends() = %v, want %v", names, want)
	}
	if b, ok := LookupBackend("a"); !ok || b.Priority != 20 {
		t.Fatalf("LookupBackend(a) = %+v, %v", b, ok)
	}
	if _, ok := LookupBackend("nope"); ok {
		t.Fatal("LookupBackend found an unregistered name")
	}
}

func TestSelectScopeRunsReach(t *testing.T) {
	emptyRegistry(t)
	scoped := fake("scoped", 1)
	scoped.Scope = func(_, _ *Caps, _, _ memory.Device) error { return errors.New("out of scope") }
	picky := fake("picky", 2)
	picky.Reach = func(o, _ *Caps, _, _ memory.Device) error {
		if string(o.Ads["picky"]) != "yes" {
			return fmt.Errorf("%s did not say yes", o.Node)
		}
		return nil
	}
	for _, b := range []Backend{scoped, picky, fake("last", 3)} {
		MustRegister(b)
	}
	all := []string{"scoped", "picky", "last"}
	a := &Caps{Node: "a", Channels: all, Ads: map[string][]byte{"picky": []byte("yes")}}
	b := &Caps{Node: "b", Channels: all}
	got := Select(a, b, memory.CPU, memory.CPU)
	want := Choice{Channel: "picky", Rejected: []Rejection{{"scoped", "out of scope"}, {"last", "picky preferred"}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Select = %+v, want %+v", got, want)
	}
	got = Select(b, a, memory.CPU, memory.CPU)
	if got.Channel != "last" || got.Rejected[1].Reason != "b did not say yes" {
		t.Fatalf("Select = %+v", got)
	}
	// Scope's reason comes before the one of an end that does not run it.
	b.Channels = []string{"last"}
	b.NotRunning = map[string]string{"scoped": "disabled in the config"}
	got = Select(a, b, memory.CPU, memory.CPU)
	if got.Rejected[0].Reason != "out of scope" || !strings.Contains(got.Rejected[1].Reason, "b does not run it: not enabled") {
		t.Fatalf("Select = %+v", got)
	}
}

func TestForHolder(t *testing.T) {
	emptyRegistry(t)
	bound := fake("bound", 1)
	bound.HolderBound = true
	MustRegister(bound)
	MustRegister(fake("free", 2))
	c := &Caps{Node: "n", Channels: []string{"bound", "free"}}
	if c.ForHolder("") != c || c.ForHolder("n") != c {
		t.Fatal("ForHolder of its own descriptor is not the node's Caps")
	}
	f := c.ForHolder("h")
	if !slices.Equal(f.Channels, []string{"free"}) || !strings.Contains(f.NotRunning["bound"], "forwarded descriptor (lent to h)") {
		t.Fatalf("ForHolder(h) = %+v", f)
	}
	if len(c.Channels) != 2 || c.NotRunning != nil {
		t.Fatalf("ForHolder changed the node's Caps: %+v", c)
	}
}

func TestLocalCapsAndOpen(t *testing.T) {
	emptyRegistry(t)
	notHere := fake("nothere", 1)
	notHere.Viable = func() error { return fmt.Errorf("%w: no such device", ErrNotViable) }
	ads := fake("ads", 2)
	ads.Advertise = func(c *Caps) { c.Ads["ads"] = []byte{1} }
	broken := fake("broken", 3)
	broken.Advertise = func(c *Caps) { c.Ads["broken"] = []byte{2} }
	broken.New = func(*Env) (Channel, error) { return nil, errors.New("broken: cannot start") }
	for _, b := range []Backend{notHere, ads, broken, fake("off", 4), fake("replaced", 5)} {
		MustRegister(b)
	}
	c := LocalCaps("n", 7, []memory.Device{memory.CPU}, func(ch string) bool { return ch == "off" }, nil)
	if c.Node != "n" || c.Incarnation != 7 || c.HostID == "" {
		t.Fatalf("LocalCaps identity: %+v", c)
	}
	if !slices.Equal(c.Channels, []string{"ads", "broken", "replaced"}) {
		t.Fatalf("Channels = %v", c.Channels)
	}
	if !strings.Contains(c.NotRunning["nothere"], "no such device") || c.NotRunning["off"] != "disabled in the config" {
		t.Fatalf("NotRunning = %v", c.NotRunning)
	}
	if len(c.Ads) != 2 {
		t.Fatalf("Ads = %v", c.Ads)
	}
	mine := &fakeChannel{"replaced"}
	chans := Open(&Env{Node: "n"}, &c, map[string]func(*Env) (Channel, error){
		"replaced": func(*Env) (Channel, error) { return mine, nil },
		"off":      func(*Env) (Channel, error) { t.Error("a disabled channel was started"); return nil, nil },
	})
	if len(chans) != 2 || chans["replaced"] != mine || chans["ads"] == nil {
		t.Fatalf("Open = %v", chans)
	}
	if !slices.Equal(c.Channels, []string{"ads", "replaced"}) || c.NotRunning["broken"] != "broken: cannot start" {
		t.Fatalf("after Open: %+v", c)
	}
	if _, ok := c.Ads["broken"]; ok {
		t.Fatal("a channel that did not start still advertises")
	}
}
