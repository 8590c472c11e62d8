package verbs_test

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

// A node starts the verbs channel where it can and otherwise reports why
// not, next to the channels it runs.
func ExampleNew() {
	env := &rdma.Env{ /* Node, Store, Control, ... from the node */ }
	ch, err := verbs.New(env)
	switch {
	case errors.Is(err, rdma.ErrNotViable):
		fmt.Println("verbs not running:", err)
	case err != nil:
		fmt.Println("verbs:", err)
	default:
		defer ch.Close()
		dev, port := ch.Device()
		fmt.Println("verbs on", dev, "port", port.Num)
	}
}
