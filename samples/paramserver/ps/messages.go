package ps

// The message types' codecs are written by msgp's generator
// (messages_gen.go; config_gen.go for Config and Layout, which Setup
// carries); the registry uses them instead of reflection. Slices and maps
// are tagged allownil so that nil stays nil as with reflection.

//go:generate msgp -file messages.go -o messages_gen.go -io=false -tests=false

//msgp:limit arrays:65536 maps:1024

import (
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// Setup asks a node's agent to start the shards and workers the layout puts
// on it. Answered with Ready.
type Setup struct {
	Config     Config
	Layout     Layout
	DriverNode string // node of the driver actor, which gets Progress and Done
}

// Ready answers Setup.
type Ready struct {
	Shards []ShardPlace `msgpack:",allownil"` // the shards this node started
	Err    string
}

// ShardPlace says where a shard runs.
type ShardPlace struct {
	Shard  int
	Node   string
	Device string
}

// Train starts a worker.
type Train struct{}

// Pull asks a shard for its weights of a step (-1: whatever it holds now).
// Answered with Weights.
type Pull struct{ Step int }

// Weights is a shard's slice of the parameter vector, version Step.
type Weights struct {
	Shard int
	Step  int
	W     *tensor.Tensor // float32[hi-lo], fetched before delivery
	Err   string
}

// Push carries a worker's gradient for one shard. Answered with Ack, in sync
// mode only once the step's update is applied.
type Push struct {
	Worker int
	Step   int
	G      *tensor.Tensor
}

// Ack answers Push.
type Ack struct {
	Shard int
	Step  int
	Err   string
}

// Progress reports a worker's loss at a step (before its update).
type Progress struct {
	Worker  int
	Step    int
	Loss    float64
	Samples int
}

// Done reports that a worker took all its steps, or failed.
type Done struct {
	Worker int
	Err    string
}

// Finish asks a node's agent to stop its shards and workers. Answered with
// Finished.
type Finish struct{}

// Finished answers Finish with the node's counters.
type Finished struct {
	Node         string
	MessagesSent int64
	Channels     map[string]ChannelBytes `msgpack:",allownil"`
}

// ChannelBytes is what one data channel moved into a node.
type ChannelBytes struct {
	Transfers int64
	Bytes     int64
}

func init() {
	for name, m := range map[string]any{
		"paramserver.Setup": &Setup{}, "paramserver.Ready": &Ready{}, "paramserver.Train": &Train{},
		"paramserver.Pull": &Pull{}, "paramserver.Weights": &Weights{}, "paramserver.Push": &Push{},
		"paramserver.Ack": &Ack{}, "paramserver.Progress": &Progress{}, "paramserver.Done": &Done{},
		"paramserver.Finish": &Finish{}, "paramserver.Finished": &Finished{},
	} {
		actor.MustRegisterMessage(name, m)
	}
}
