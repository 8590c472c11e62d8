package gossip_test

import (
	"fmt"
	"time"

	"github.com/tensorferry/tensorferry/cluster/gossip"
)

// printer prints the membership events.
type printer chan string

func (p printer) Join(m gossip.Member) {
	p <- fmt.Sprintf("join %s (incarnation %d)", m.Name, m.Incarnation)
}
func (p printer) Leave(m gossip.Member, reason string) {
	p <- fmt.Sprintf("leave %s: %s", m.Name, reason)
}

func Example() {
	secret := []byte("an example secret of 32 bytes...")
	start := func(name string, ev gossip.Events) *gossip.Gossip {
		g, err := gossip.Start(gossip.Config{
			Cluster: "demo",
			Secret:  secret,
			Self: gossip.Member{Name: name, Incarnation: 1, Address: "127.0.0.1:7001",
				DataAddress: "127.0.0.1:7101", GossipAddress: "127.0.0.1:0"},
		}, ev)
		if err != nil {
			panic(err)
		}
		return g
	}
	seen := make(printer, 8)
	a := start("a", seen)
	defer a.Shutdown()
	b := start("b", make(printer, 8))
	if _, err := b.Join([]string{a.Self().GossipAddress}); err != nil {
		panic(err)
	}
	fmt.Println(<-seen)
	b.Leave(time.Second)
	b.Shutdown()
	fmt.Println(<-seen)
	fmt.Println(len(a.Members()), "member")
	// Output:
	// join b (incarnation 1)
	// leave b: left
	// 1 member
}
