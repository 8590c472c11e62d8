package actor_test

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tinylib/msgp/msgp"
)

// Picky has a hand-written msgp codec whose decoder refuses Bad, and
// counts the decodes run by an inline mailbox (off the connection's
// reader).
type Picky struct {
	N   int
	Bad bool
	Pad []byte // long or short: a held body is copied either way
}

// pickyPad is the Pad of message i: none, short or long (a held body is
// the reader's copy, whatever its length).
func pickyPad(i int) []byte {
	return bytes.Repeat([]byte{byte(i)}, (i%3)*150)
}

var pickyInMailbox atomic.Int64

func (p *Picky) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendInt(b, p.N)
	b = msgp.AppendBool(b, p.Bad)
	return msgp.AppendBytes(b, p.Pad), nil
}

func (p *Picky) UnmarshalMsg(b []byte) ([]byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, err
	}
	if n != 3 {
		return nil, errors.New("picky: want 3 fields")
	}
	if p.N, b, err = msgp.ReadIntBytes(b); err != nil {
		return nil, err
	}
	if p.Bad, b, err = msgp.ReadBoolBytes(b); err != nil {
		return nil, err
	}
	if p.Pad, b, err = msgp.ReadBytesBytes(b, nil); err != nil {
		return nil, err
	}
	buf := make([]byte, 16<<10)
	if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "actor.(*onReaderMailbox).run") {
		pickyInMailbox.Add(1)
	}
	if p.Bad {
		return nil, errors.New("picky: refused")
	}
	return b, nil
}

func init() { actor.MustRegisterMessage("test.Picky", &Picky{}) }

// TestLazyDecodeInBursts: a burst of messages to an actor with inline
// delivery is decoded by the actor's goroutine (its mailbox), not the
// connection's reader; the messages arrive in order, and one whose body
// does not decode is reported to its sender, as on the reader, while the
// others still arrive.
func TestLazyDecodeInBursts(t *testing.T) {
	_, nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	actor.SetLazyDecode(b, true) // as on a host with processors to spare
	const n, bad = 2000, 1000
	got := make(chan int, n)
	sink := pa.PropsFromFunc(func(c pa.Context) {
		if p, ok := c.Message().(*Picky); ok {
			if !bytes.Equal(p.Pad, pickyPad(p.N)) {
				p.N = -1 - p.N // reported below as out of order
			}
			got <- p.N
		}
	}, b.WithInlineDelivery())
	if _, err := b.Root().SpawnNamed(sink, "picky"); err != nil {
		t.Fatal(err)
	}
	failed := make(chan *actor.DeliveryFailed, 1)
	target := a.PID(b.Name(), "picky")
	sender := pa.PropsFromFunc(func(c pa.Context) {
		switch m := c.Message().(type) {
		case *pa.Started:
			for i := range n {
				c.Request(target, &Picky{N: i, Bad: i == bad, Pad: pickyPad(i)})
			}
		case *actor.DeliveryFailed:
			failed <- m
		}
	})
	before := pickyInMailbox.Load()
	if _, err := a.Root().SpawnNamed(sender, "picky-sender"); err != nil {
		t.Fatal(err)
	}
	select {
	case df := <-failed:
		if !strings.Contains(df.Reason, "picky: refused") {
			t.Fatalf("reason %q", df.Reason)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the message that does not decode was not reported")
	}
	want := 0
	for want < n {
		if want == bad {
			want++
			continue
		}
		select {
		case i := <-got:
			if i != want {
				t.Fatalf("got message %d, want %d (negative: its padding changed)", i, want)
			}
			want++
		case <-time.After(20 * time.Second):
			t.Fatalf("message %d never arrived", want)
		}
	}
	if pickyInMailbox.Load() == before {
		t.Fatal("no message of the burst was decoded by the actor's mailbox")
	}
}
