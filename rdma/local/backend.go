package local

import (
	"errors"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
)

func init() {
	rdma.MustRegister(rdma.Backend{
		Name:     rdma.Local,
		Priority: 10,
		Scope:    scope,
		Reach:    func(_, _ *rdma.Caps, _, _ memory.Device) error { return nil },
		New:      func(env *rdma.Env) (rdma.Channel, error) { return New(env) },
	})
}

var errOtherProcess = errors.New("different processes")

// scope admits only transfers within one process: the same node in the
// same incarnation.
func scope(owner, fetcher *rdma.Caps, _, _ memory.Device) error {
	if owner.Node != fetcher.Node || owner.Incarnation != fetcher.Incarnation {
		return errOtherProcess
	}
	return nil
}
