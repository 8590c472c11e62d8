package actor

import (
	"reflect"

	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/transfer"
	"github.com/tensorferry/tensorferry/wire"
)

// registry holds the message types that may cross nodes. Plain Go structs
// are encoded with msgpack (and may hold *tensor.Tensor and tensor.Ref
// fields); protobuf messages with protobuf.
var registry = wire.NewRegistry()

func init() {
	// protoactor-go's own messages that cross nodes as user messages.
	registry.MustRegister("actor.PoisonPill", &pa.PoisonPill{})
	registry.MustRegister("actor.DeadLetterResponse", &pa.DeadLetterResponse{})
	registry.MustRegister("actor.Touch", &pa.Touch{})
	registry.MustRegister("actor.Touched", &pa.Touched{})
}

// RegisterMessage makes a message type sendable between nodes under name,
// which must be the same on every node. sample is a value or a pointer of
// the type; a protobuf message is encoded with protobuf, anything else with
// msgpack. Every node of a cluster must register the same types. The
// type's tensor fields (*tensor.Tensor and tensor.Ref, also in nested
// structs, slices, arrays and map values) are found now, once.
func RegisterMessage(name string, sample any) error {
	if err := registry.Register(name, sample); err != nil {
		return err
	}
	transfer.HoldsTensors(reflect.TypeOf(sample))
	return nil
}

// MustRegisterMessage is RegisterMessage that panics on error, for init
// functions.
func MustRegisterMessage(name string, sample any) {
	if err := RegisterMessage(name, sample); err != nil {
		panic(err)
	}
}
