package gossip

import (
	"net"
	"testing"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// newBare returns a Gossip with no memberlist, to drive its event logic
// directly: put what memberlist would report, then apply what take returns.
func newBare(t *testing.T) (*Gossip, *recorder, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	rec := newRecorder()
	g := &Gossip{
		log: zap.New(core), ev: rec, self: Member{Name: "self"},
		members: map[string]Member{}, highest: map[string]uint64{}, leaving: map[string]bool{}, badMeta: map[string]string{},
	}
	g.events.init("self")
	return g, rec, logs
}

func mlNode(name string, port uint16, m nodeMeta) *memberlist.Node {
	return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: port, Meta: appendMeta(nil, m)}
}

func (g *Gossip) flush() {
	for _, c := range g.events.take() {
		g.apply(c)
	}
}

func TestEventsCoalesceAndOrder(t *testing.T) {
	g, rec, _ := newBare(t)
	ed := (*eventDelegate)(g)
	m1 := nodeMeta{Incarnation: 1, Address: "a:1", DataAddress: "a:2"}

	// Events about self are never delivered.
	ed.NotifyJoin(mlNode("self", 1, m1))
	// Joined, left and back before any delivery: one Join (nothing was
	// seen of it before).
	ed.NotifyJoin(mlNode("a", 10, m1))
	ed.NotifyLeave(mlNode("a", 10, m1))
	ed.NotifyJoin(mlNode("a", 10, m1))
	ed.NotifyJoin(mlNode("b", 11, m1))
	g.flush()
	got := rec.all()
	if len(got) != 2 || !got[0].join || got[0].m.Name != "a" || !got[1].join || got[1].m.Name != "b" {
		t.Fatalf("events %v, want Join(a), Join(b)", got)
	}
	if got[0].m != (Member{Name: "a", Incarnation: 1, Address: "a:1", DataAddress: "a:2", GossipAddress: "127.0.0.1:10"}) {
		t.Errorf("member %+v", got[0].m)
	}

	// Seen, then left and back before delivery: Leave then Join, never a
	// silent drop of the Leave.
	ed.NotifyLeave(mlNode("a", 10, m1))
	ed.NotifyJoin(mlNode("a", 10, m1))
	// An update that changes nothing delivers nothing.
	ed.NotifyUpdate(mlNode("b", 11, m1))
	g.flush()
	got = rec.all()[2:]
	if len(got) != 2 || got[0].join || got[0].reason != reasonDead || !got[1].join {
		t.Fatalf("events %v, want Leave(a, dead), Join(a)", got)
	}

	// The queue holds one entry per node whatever the number of changes.
	for range 1000 {
		ed.NotifyLeave(mlNode("a", 10, m1))
		ed.NotifyJoin(mlNode("a", 10, m1))
	}
	g.events.mu.Lock()
	n := len(g.events.pending)
	g.events.mu.Unlock()
	if n != 1 {
		t.Errorf("%d entries queued for one node", n)
	}
}

func TestEventsIncarnations(t *testing.T) {
	g, rec, logs := newBare(t)
	ed := (*eventDelegate)(g)
	m := func(inc uint64) nodeMeta { return nodeMeta{Incarnation: inc, Address: "a:1", DataAddress: "a:2"} }

	ed.NotifyJoin(mlNode("a", 10, m(5)))
	g.flush()
	// A restart: the old incarnation leaves, the new one joins.
	ed.NotifyUpdate(mlNode("a", 10, m(6)))
	g.flush()
	got := rec.all()
	if len(got) != 3 || got[1].join || got[1].m.Incarnation != 5 || got[1].reason != "restarted as incarnation 6" ||
		!got[2].join || got[2].m.Incarnation != 6 {
		t.Fatalf("events %v", got)
	}
	// A lower incarnation never displaces a higher one...
	ed.NotifyUpdate(mlNode("a", 10, m(5)))
	g.flush()
	if got := rec.all(); len(got) != 3 {
		t.Fatalf("lower incarnation delivered: %v", got[3:])
	}
	if logs.FilterMessage("a lower incarnation claims a member's name: ignored").Len() != 1 {
		t.Errorf("not logged: %v", logs.All())
	}
	// ...nor joins after the higher one left.
	ed.NotifyLeave(mlNode("a", 10, m(6)))
	ed.NotifyJoin(mlNode("a", 12, m(4)))
	g.flush()
	got = rec.all()[3:]
	if len(got) != 1 || got[0].join || got[0].m.Incarnation != 6 {
		t.Fatalf("events %v, want only Leave(a#6)", got)
	}
	if _, ok := g.Alive("a"); ok {
		t.Error("a alive")
	}
	// The same incarnation may come back (a false suspicion refuted late).
	ed.NotifyJoin(mlNode("a", 10, m(6)))
	g.flush()
	if got := rec.all()[4:]; len(got) != 1 || !got[0].join || got[0].m.Incarnation != 6 {
		t.Fatalf("events %v, want Join(a#6)", got)
	}
	// New addresses under the same incarnation: Leave and Join.
	moved := m(6)
	moved.DataAddress = "a:3"
	ed.NotifyUpdate(mlNode("a", 10, moved))
	g.flush()
	if got := rec.all()[5:]; len(got) != 2 || got[0].reason != "announced other addresses" || got[1].m.DataAddress != "a:3" {
		t.Fatalf("events %v", got)
	}
}

func TestEventsLeavingAndBadMeta(t *testing.T) {
	g, rec, logs := newBare(t)
	ed := (*eventDelegate)(g)
	m1 := nodeMeta{Incarnation: 1, Address: "a:1", DataAddress: "a:2"}
	ed.NotifyJoin(mlNode("a", 10, m1))
	ed.NotifyJoin(mlNode("b", 11, m1))
	g.flush()
	// a announces it leaves, then leaves: "left". The announcement alone
	// delivers nothing.
	leaving := m1
	leaving.Leaving = true
	ed.NotifyUpdate(mlNode("a", 10, leaving))
	g.flush()
	if n := len(rec.all()); n != 2 {
		t.Fatalf("announcement delivered %v", rec.all()[2:])
	}
	ed.NotifyLeave(mlNode("a", 10, leaving))
	// b's announcement and leave coalesce: "left" too.
	ed.NotifyUpdate(mlNode("b", 11, leaving))
	ed.NotifyLeave(mlNode("b", 11, leaving))
	g.flush()
	got := rec.all()[2:]
	if len(got) != 2 || got[0].reason != reasonLeft || got[1].reason != reasonLeft {
		t.Fatalf("events %v, want two Leave(left)", got)
	}

	// Meta that does not decode: not joined, logged once per meta.
	bad := &memberlist.Node{Name: "c", Addr: net.IPv4(127, 0, 0, 1), Port: 12, Meta: []byte{0x91, 0x01}}
	for range 3 {
		ed.NotifyJoin(bad)
		g.flush()
	}
	if got := rec.all()[4:]; len(got) != 0 {
		t.Errorf("bad meta delivered %v", got)
	}
	if n := logs.FilterMessage("member with unreadable node meta: not reported as joined").Len(); n != 1 {
		t.Errorf("logged %d times", n)
	}
	// A member whose meta turns bad leaves.
	ed.NotifyJoin(mlNode("d", 13, m1))
	g.flush()
	ed.NotifyUpdate(&memberlist.Node{Name: "d", Addr: net.IPv4(127, 0, 0, 1), Port: 13, Meta: []byte{0xc0}})
	g.flush()
	if got := rec.all()[4:]; len(got) != 2 || got[1].join || got[1].reason != "unreadable node meta" {
		t.Errorf("events %v", got)
	}
}

func TestMemberlistLogLevels(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	std, w := newStdLogger(zap.New(core))
	std.Printf("[DEBUG] memberlist: d")
	std.Printf("[INFO] memberlist: i")
	std.Printf("[WARN] memberlist: w")
	std.Printf("[ERR] memberlist: e")
	std.Printf("no prefix")
	w.stop()
	std.Printf("[ERR] memberlist: after stop")
	want := []struct {
		lvl string
		msg string
	}{{"debug", "d"}, {"info", "i"}, {"warn", "w"}, {"warn", "e"}, {"info", "no prefix"}}
	got := logs.All()
	if len(got) != len(want) {
		t.Fatalf("logged %v", got)
	}
	for i, e := range got {
		if e.Level.String() != want[i].lvl || e.Message != want[i].msg {
			t.Errorf("entry %d: %s %q, want %s %q", i, e.Level, e.Message, want[i].lvl, want[i].msg)
		}
	}
}
