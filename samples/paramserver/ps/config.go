package ps

//go:generate msgp -file config.go -o config_gen.go -io=false -tests=false

//msgp:limit arrays:65536 maps:1024

import (
	"errors"
	"fmt"
)

// Mode is how a shard applies gradients.
type Mode string

const (
	// Sync: each shard waits for the gradients of every worker for step k,
	// averages them, applies one SGD update, and only then answers the pulls
	// of step k+1.
	Sync Mode = "sync"
	// Async: each shard applies every gradient as it arrives (scaled by
	// 1/Workers), and answers pulls with whatever weights it holds.
	Async Mode = "async"
)

// Config describes one training run. The driver sends it to every node, so
// only the driver's values matter.
type Config struct {
	Mode    Mode
	Steps   int // SGD steps each worker takes
	Dim     int // length of the parameter vector
	Workers int // worker actors
	Shards  int // PS shard actors; the vector is split into Shards contiguous ranges
	// SamplesPerWorker is the number of data rows each worker owns
	// (default: 8·Dim/Workers, so that the problem is overdetermined 8 to 1).
	SamplesPerWorker int
	// NonZeros is the number of non-zero features of one sample (default 8).
	NonZeros int
	LR       float64 // learning rate of the averaged gradient (default 0.7)
	Noise    float64 // standard deviation of the label noise (default 0.1)
	Seed     uint64  // seeds w* and every worker's data
}

// DefaultConfig returns the configuration `go run ./samples/paramserver`
// uses: a vector of 65536 float32 (256 KiB, split into two 128 KiB shards,
// so every pull and push moves out of band), two workers with 262144 sparse
// samples each, 30 synchronous steps.
func DefaultConfig() Config {
	return Config{Mode: Sync, Steps: 30, Dim: 65536, Workers: 2, Shards: 2, LR: 0.7, Noise: 0.1, NonZeros: 8, Seed: 1}
}

// maxDim bounds Dim (1 GiB of float32).
const maxDim = 1 << 28

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("ps: bad config")

// Validate checks c and fills zero defaults.
func (c *Config) Validate() error {
	if c.Mode == "" {
		c.Mode = Sync
	}
	if c.NonZeros == 0 {
		c.NonZeros = 8
	}
	if c.SamplesPerWorker == 0 && c.Workers > 0 {
		c.SamplesPerWorker = (8*c.Dim + c.Workers - 1) / c.Workers
	}
	switch {
	case c.Mode != Sync && c.Mode != Async:
		return fmt.Errorf("%w: mode %q, want sync or async", ErrConfig, c.Mode)
	case c.Steps < 1:
		return fmt.Errorf("%w: %d steps", ErrConfig, c.Steps)
	case c.Dim < 1 || c.Dim > maxDim:
		return fmt.Errorf("%w: dim %d, want 1..%d", ErrConfig, c.Dim, maxDim)
	case c.Workers < 1 || c.Workers > 1024:
		return fmt.Errorf("%w: %d workers, want 1..1024", ErrConfig, c.Workers)
	case c.Shards < 1 || c.Shards > c.Dim:
		return fmt.Errorf("%w: %d shards for dim %d", ErrConfig, c.Shards, c.Dim)
	case c.SamplesPerWorker < 1 || int64(c.SamplesPerWorker)*int64(c.NonZeros) > 1<<31-1:
		return fmt.Errorf("%w: %d samples per worker", ErrConfig, c.SamplesPerWorker)
	case c.NonZeros < 1 || c.NonZeros > c.Dim:
		return fmt.Errorf("%w: %d non-zeros per sample for dim %d", ErrConfig, c.NonZeros, c.Dim)
	case !(c.LR > 0) || c.LR > 10:
		return fmt.Errorf("%w: learning rate %v", ErrConfig, c.LR)
	case !(c.Noise >= 0):
		return fmt.Errorf("%w: noise %v", ErrConfig, c.Noise)
	}
	return nil
}

// shardRange returns the half-open range of the vector that shard i holds.
func (c *Config) shardRange(i int) (lo, hi int) {
	return i * c.Dim / c.Shards, (i + 1) * c.Dim / c.Shards
}

// Layout places shards and workers on the nodes of a cluster.
type Layout struct {
	ShardNodes  []string `msgpack:",allownil"` // ShardNodes[i] runs shard i
	WorkerNodes []string `msgpack:",allownil"` // WorkerNodes[j] runs worker j
}

// Driver returns the node that drives training: the node of worker 0.
func (l Layout) Driver() string { return l.WorkerNodes[0] }

// Roles places shards on the first ⌈n/3⌉ nodes of the list (round robin) and
// workers on the others (round robin), so a 3-node cluster has one shard node
// and two worker nodes. With a single node it holds both.
func Roles(nodes []string, shards, workers int) (Layout, error) {
	if len(nodes) == 0 || shards < 1 || workers < 1 {
		return Layout{}, fmt.Errorf("%w: %d nodes, %d shards, %d workers", ErrConfig, len(nodes), shards, workers)
	}
	ns := (len(nodes) + 2) / 3
	sn, wn := nodes[:ns], nodes[ns:]
	if len(wn) == 0 {
		wn = nodes
	}
	var l Layout
	for i := range shards {
		l.ShardNodes = append(l.ShardNodes, sn[i%len(sn)])
	}
	for j := range workers {
		l.WorkerNodes = append(l.WorkerNodes, wn[j%len(wn)])
	}
	return l, nil
}

// Actor names, the same on every node.
const (
	agentID  = "ps-agent"
	driverID = "ps-driver"
)

func shardID(i int) string  { return fmt.Sprintf("ps-shard-%d", i) }
func workerID(j int) string { return fmt.Sprintf("ps-worker-%d", j) }
