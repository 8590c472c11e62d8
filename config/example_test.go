package config_test

import (
	"fmt"
	"log"

	"github.com/tensorferry/tensorferry/config"
)

func ExampleLoad() {
	cfg, err := config.Load("testdata/local3.yaml")
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range cfg.Nodes {
		fmt.Println(n.Name, n.Address, n.DataAddress, n.Devices, cfg.ChannelDisabled(n.Name, "verbs"))
	}
	fmt.Println(cfg.Transport.MaxFrameSize, cfg.Staging.ChunkSize, cfg.Staging.Stripes)
	// Output:
	// a 127.0.0.1:7001 127.0.0.1:7101 [cuda:0] false
	// b 127.0.0.1:7002 127.0.0.1:7202 [cuda:1] false
	// c 127.0.0.1:7003 127.0.0.1:7103 [cpu] true
	// 16777216 4194304 2
}

func ExampleParse() {
	_, err := config.Parse([]byte(`cluster: demo
secret_file: secret.key
nodes:
  - name: a
    address: 127.0.0.1:7001
  - name: b
    address: 127.0.0.1:7001
`), "testdata")
	fmt.Println(err)
	// Output:
	// config: line 7: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
}

func ExampleDefaultConfig() {
	cfg := config.DefaultConfig()
	cfg.Cluster = "demo"
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	cfg.Nodes = []config.NodeConfig{{Name: "a", Address: "10.0.0.1:7001"}, {Name: "b", Address: "10.0.0.2:7001"}}
	cfg.Staging.Stripes = 4                  // split large staging transfers over 4 connections
	cfg.Flow.ReceiveBudget = 8 << 30         // 8 GiB for tensors being fetched
	cfg.Flow.ReceiveBudgetPerPeer = 16 << 30 // more than the budget: refused
	fmt.Println(cfg.Validate())
	// Output:
	// config: flow.receive_budget_per_peer: 16GiB is above receive_budget (8GiB)
}
