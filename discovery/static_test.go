package discovery

import (
	"context"
	"errors"
	"testing"

	"github.com/tensorferry/tensorferry/config"
)

func TestStatic(t *testing.T) {
	cfg, err := config.LocalConfig("static", 3)
	if err != nil {
		t.Fatal(err)
	}
	d, err := FromConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.String() != "static" {
		t.Errorf("String() = %q", d.String())
	}
	var got []Event
	if err := d.Start(context.Background(), cfg.Nodes[1], func(ev Event) { got = append(got, ev) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Node.Name != "node0" || got[1].Node.Name != "node2" || got[0].Kind != Joined || got[1].Kind != Joined {
		t.Fatalf("events %+v, want node0 and node2 joined", got)
	}
	if n := got[1].Node; n.Address != cfg.Nodes[2].Address || n.DataAddress != cfg.Nodes[2].DataAddress || len(n.Devices) != 1 {
		t.Errorf("node2 as %+v, want %+v", n, cfg.Nodes[2])
	}
	if err := d.Start(context.Background(), cfg.Nodes[1], func(Event) {}); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNewEtcdNeedsTheSection(t *testing.T) {
	cfg, err := config.LocalConfig("static", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewEtcd(cfg, nil); err == nil {
		t.Fatal("NewEtcd without discovery.etcd")
	}
}

func TestEventKindString(t *testing.T) {
	if Joined.String() != "joined" || Left.String() != "left" || EventKind(9).String() != "EventKind(9)" {
		t.Error(Joined, Left, EventKind(9))
	}
}
