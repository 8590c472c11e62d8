package discovery_test

import (
	"context"
	"fmt"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/discovery"
)

// A node learns the other nodes of the config's list (with a
// discovery.etcd section, FromConfig returns the etcd one instead).
func Example() {
	cfg, err := config.LocalConfig("demo", 3)
	if err != nil {
		panic(err)
	}
	d, err := discovery.FromConfig(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer d.Close()
	self, _ := cfg.Node("node0")
	err = d.Start(context.Background(), self, func(ev discovery.Event) {
		fmt.Println(ev.Kind, ev.Node.Name, ev.Node.Devices)
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(d)
	// Output:
	// joined node1 [cpu]
	// joined node2 [cpu]
	// static
}
