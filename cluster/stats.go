package cluster

import (
	"sync"

	"github.com/tensorferry/tensorferry/wire"
)

// ConnKey names a kind of connection: its purpose (wire.PurposeControl,
// wire.PurposeData) and its transport (the network of its remote address:
// "tcp", or another Network's name).
type ConnKey struct {
	Purpose   string
	Transport string
}

// connCounts counts the open data connections by transport.
type connCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *connCounts) add(transport string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[transport] += d
}

// Conns returns the open connections of this node by purpose and
// transport: the control connections to peers (up or coming up) and the
// data connections peers opened to this node (a data connection is counted
// by the node that accepted it: its dialer hands it to a channel, whose
// type it keeps).
func (m *Membership) Conns() map[ConnKey]int {
	out := map[ConnKey]int{}
	m.mu.Lock()
	for _, s := range m.slots {
		if l := s.curLink(); l != nil {
			out[ConnKey{wire.PurposeControl, l.transport}]++
		}
	}
	m.mu.Unlock()
	m.dataByTransport.mu.Lock()
	for tr, n := range m.dataByTransport.n {
		if n > 0 {
			out[ConnKey{wire.PurposeData, tr}] += n
		}
	}
	m.dataByTransport.mu.Unlock()
	return out
}
