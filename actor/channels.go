package actor

import (
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/local"
	"github.com/tensorferry/tensorferry/rdma/staging"
)

// defaultChannels returns the factories of the channels every node runs
// unless the config disables them.
func defaultChannels() map[string]ChannelFactory {
	return map[string]ChannelFactory{
		rdma.Local:   func(env *rdma.Env) (rdma.Channel, error) { return local.New(env) },
		rdma.Staging: func(env *rdma.Env) (rdma.Channel, error) { return staging.New(env) },
	}
}
