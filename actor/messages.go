package actor

import (
	pa "github.com/asynkron/protoactor-go/actor"
	"github.com/tensorferry/tensorferry/tensor"
	"github.com/tensorferry/tensorferry/wire"
	"github.com/vmihailenco/msgpack/v5"
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
// msgpack. Every node of a cluster must register the same types.
func RegisterMessage(name string, sample any) error { return registry.Register(name, sample) }

// MustRegisterMessage is RegisterMessage that panics on error, for init
// functions.
func MustRegisterMessage(name string, sample any) { registry.MustRegister(name, sample) }

func encodeMessage(msg any, s *encodeSession) (string, uint8, []byte, error) {
	var unbind func()
	name, ser, body, err := registry.EncodeWith(msg, func(enc *msgpack.Encoder) {
		unbind = tensor.BindEncoder(enc, s)
	})
	if unbind != nil {
		unbind()
	}
	return name, ser, body, err
}

func decodeMessage(name string, ser uint8, body []byte, s *decodeSession) (any, error) {
	var unbind func()
	msg, err := registry.DecodeWith(name, ser, body, func(dec *msgpack.Decoder) {
		unbind = tensor.BindDecoder(dec, s)
	})
	if unbind != nil {
		unbind()
	}
	return msg, err
}
