package ibverbs_test

import (
	"errors"
	"fmt"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
)

// Devices lists RDMA devices and their ports; without rdma-core or a device
// the error says why.
func ExampleDevices() {
	devs, err := ibverbs.Devices()
	if errors.Is(err, ibverbs.ErrNoRDMA) {
		fmt.Println("no RDMA here:", err)
		return
	}
	for _, d := range devs {
		for _, p := range d.Ports {
			fmt.Printf("%s port %d: %s %s MTU %s usable %v GID index %d\n",
				d.Name, p.Num, p.State, p.LinkLayer, p.ActiveMTU, p.Usable(), p.GIDIndex())
		}
	}
}
