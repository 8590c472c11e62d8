package pipe

// The message types' codecs are written by msgp's generator
// (messages_gen.go); the registry uses them instead of reflection.

//go:generate msgp -file messages.go -o messages_gen.go -io=false -tests=false

import (
	"github.com/tensorferry/tensorferry/actor"
	"github.com/tensorferry/tensorferry/tensor"
)

// Input is a micro-batch for stage 1; the reply (an Output) comes from
// stage 3.
type Input struct {
	Batch int
	X     *tensor.Tensor // Rows×Dim
}

// Act1 goes from stage 1 to stage 2. A and Skip are the same tensor: A is
// fetched before delivery, because stage 2 computes with it; Skip is a Ref
// that stage 2 forwards to stage 3 without moving its bytes.
type Act1 struct {
	Batch int
	A     *tensor.Tensor
	Skip  tensor.Ref
}

// Act2 goes from stage 2 to stage 3: its own output and the forwarded Ref to
// stage 1's activation. Stage 3 fetches both, Skip from stage 1's node.
type Act2 struct {
	Batch int
	A     tensor.Ref
	Skip  tensor.Ref
}

// Output is stage 3's answer for a micro-batch.
type Output struct {
	Batch int
	Y     *tensor.Tensor // Rows×Out
	Err   string
}

func init() {
	actor.MustRegisterMessage("pipeline.Input", &Input{})
	actor.MustRegisterMessage("pipeline.Act1", &Act1{})
	actor.MustRegisterMessage("pipeline.Act2", &Act2{})
	actor.MustRegisterMessage("pipeline.Output", &Output{})
}
