package verbs

import (
	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
)

var _ rdma.CacheHolder = (*Channel)(nil)

// RegCaches returns the channel's registration cache of fetch
// destinations ("verbs"), whose counters a node reports.
func (c *Channel) RegCaches() []*memory.RegCache { return []*memory.RegCache{c.dests} }
