package cluster_test

import (
	"fmt"
	"log"

	"github.com/tensorferry/tensorferry/cluster"
)

func ExampleLoad() {
	cfg, err := cluster.Load("testdata/local3.yaml")
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range cfg.Nodes {
		fmt.Println(n.Name, n.Address, n.DataAddress, n.Devices, cfg.ChannelDisabled(n.Name, "verbs"))
	}
	// Output:
	// a 127.0.0.1:7001 127.0.0.1:7101 [cuda:0] false
	// b 127.0.0.1:7002 127.0.0.1:7202 [cuda:1] false
	// c 127.0.0.1:7003 127.0.0.1:7103 [cpu] true
}

func ExampleParse() {
	_, err := cluster.Parse([]byte(`cluster: demo
secret_file: secret.key
nodes:
  - name: a
    address: 127.0.0.1:7001
  - name: b
    address: 127.0.0.1:7001
`), "testdata")
	fmt.Println(err)
	// Output:
	// cluster: config line 7: nodes[1].address: duplicate of nodes[0] ("127.0.0.1:7001")
}
