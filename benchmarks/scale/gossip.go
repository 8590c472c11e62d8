package main

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tensorferry/tensorferry/cluster/gossip"
	"github.com/tensorferry/tensorferry/cluster/gossip/gossiptest"
	"github.com/tensorferry/tensorferry/config"
)

// gossipCluster is N gossip nodes joined through node 0.
type gossipCluster struct {
	nodes  []*gossip.Gossip
	freeze *gossiptest.Freezer // of the last node
	downs  downLog
}

// gossipEvents logs a node's Leaves.
type gossipEvents struct {
	idx   int
	downs *downLog
}

func (gossipEvents) Join(gossip.Member)                {}
func (e gossipEvents) Leave(m gossip.Member, _ string) { e.downs.add(e.idx, m.Name) }

// startGossip starts n nodes with the gossip timings of cfg, joins them and
// waits until every node sees every other.
func startGossip(n int, cfg *config.Config, converge time.Duration, joinRate float64) (*gossipCluster, error) {
	c := &gossipCluster{freeze: new(gossiptest.Freezer)}
	t0 := time.Now()
	for i := range n {
		// Paced: every join is news gossiped to every member.
		if wait := time.Duration(float64(i)/joinRate*float64(time.Second)) - time.Since(t0); wait > 0 {
			time.Sleep(wait)
		}
		gc := gossip.Config{
			Cluster: "scale",
			Secret:  cfg.Secret,
			Self: gossip.Member{Name: fmt.Sprintf("node%d", i), Incarnation: uint64(time.Now().UnixNano()),
				Address: "127.0.0.1:7001", DataAddress: "127.0.0.1:7101", GossipAddress: "127.0.0.1:0"},
			Gossip: cfg.Gossip,
		}
		if i == n-1 {
			gc.Transport = c.freeze.Wrap
		}
		g, err := gossip.Start(gc, gossipEvents{i, &c.downs})
		if err != nil {
			c.close()
			return nil, err
		}
		c.nodes = append(c.nodes, g)
		if i > 0 {
			if err := c.join(g, i); err != nil {
				c.close()
				return nil, fmt.Errorf("node %d of %d: %w", i, n, err)
			}
		}
	}
	deadline := time.Now().Add(converge)
	for _, g := range c.nodes {
		for g.Stats().Members < n {
			if time.Now().After(deadline) {
				c.close()
				return nil, fmt.Errorf("gossip of %d: %s sees %d members after %v", n, g.Self().Name, g.Stats().Members, converge)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return c, nil
}

// joinAttempts bounds the joins of one node: with every node in one
// process, a join storm (each new node is news gossiped to all) can keep
// a seed from answering within tcp_timeout.
const joinAttempts = 10

// join joins node i through node 0, or through another joined node
// when that fails, as a restarting node retries.
func (c *gossipCluster) join(g *gossip.Gossip, i int) error {
	var err error
	for a := range joinAttempts {
		seed := c.nodes[0]
		if a > 0 {
			seed = c.nodes[rand.IntN(i)]
			time.Sleep(100 * time.Millisecond)
		}
		if _, err = g.Join([]string{seed.Self().GossipAddress}); err == nil {
			return nil
		}
	}
	return err
}

func (c *gossipCluster) name(i int) string { return c.nodes[i].Self().Name }

// traffic returns the packets and streams (messages on the wire) and the
// bytes the nodes sent so far.
func (c *gossipCluster) traffic() (msgs, bytes uint64) {
	for _, g := range c.nodes {
		s := g.Stats()
		msgs += s.PacketsSent + s.StreamsDialed
		bytes += s.PacketBytesSent + s.StreamBytesSent
	}
	return
}

func (c *gossipCluster) downLog() *downLog { return &c.downs }

// freezeNode freezes node i, which must be the last one.
func (c *gossipCluster) freezeNode(i int) {
	if i != len(c.nodes)-1 {
		panic("scale: only the last gossip node can be frozen")
	}
	c.freeze.Freeze()
}

// kill shuts node i down without a Leave: its sockets close.
func (c *gossipCluster) kill(i int) {
	c.nodes[i].Shutdown()
}

func (c *gossipCluster) close() {
	var wg sync.WaitGroup
	for _, g := range c.nodes {
		wg.Go(func() { g.Shutdown() })
	}
	wg.Wait()
}
