package actor

import (
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/ipc"
	"github.com/tensorferry/tensorferry/rdma/local"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

// defaultChannels returns the factories of the channels every node runs
// unless the config disables them or they are not viable on this machine.
func defaultChannels() map[string]ChannelFactory {
	return map[string]ChannelFactory{
		rdma.Local:   func(env *rdma.Env) (rdma.Channel, error) { return local.New(env) },
		rdma.IPC:     func(env *rdma.Env) (rdma.Channel, error) { return ipc.New(env) },
		rdma.Staging: func(env *rdma.Env) (rdma.Channel, error) { return staging.New(env) },
		rdma.Verbs:   func(env *rdma.Env) (rdma.Channel, error) { return verbs.New(env) },
	}
}

// rdmaDevices returns what a running channel reports about RDMA devices.
func rdmaDevices(name string) []rdma.RDMADevice {
	if name == rdma.Verbs {
		return verbs.Advertise()
	}
	return nil
}
