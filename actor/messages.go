package actor

import (
	"reflect"
	"sync"

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
	if msg != nil && !carriesTensors(reflect.TypeOf(msg)) {
		return registry.Encode(msg)
	}
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
	if s == nil {
		return registry.Decode(name, ser, body)
	}
	var unbind func()
	msg, err := registry.DecodeWith(name, ser, body, func(dec *msgpack.Decoder) {
		unbind = tensor.BindDecoder(dec, s)
	})
	if unbind != nil {
		unbind()
	}
	return msg, err
}

var (
	tensorType = reflect.TypeFor[tensor.Tensor]()
	refType    = reflect.TypeFor[tensor.Ref]()
	hasTensors sync.Map // reflect.Type → bool
)

// carriesTensors reports whether values of typ may hold tensors or Refs, so
// that messages without any skip the tensor session (the common, small
// message stays on the fastest path).
func carriesTensors(typ reflect.Type) bool {
	if v, ok := hasTensors.Load(typ); ok {
		return v.(bool)
	}
	v := walkTensors(typ, map[reflect.Type]bool{})
	hasTensors.Store(typ, v)
	return v
}

func walkTensors(typ reflect.Type, seen map[reflect.Type]bool) bool {
	if typ == tensorType || typ == refType {
		return true
	}
	if seen[typ] {
		return false
	}
	seen[typ] = true
	switch typ.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return walkTensors(typ.Elem(), seen)
	case reflect.Map:
		return walkTensors(typ.Key(), seen) || walkTensors(typ.Elem(), seen)
	case reflect.Interface:
		return true // could hold anything
	case reflect.Struct:
		for i := range typ.NumField() {
			if walkTensors(typ.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}
