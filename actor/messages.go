package actor

import (
	"maps"
	"reflect"
	"sync"
	"sync/atomic"

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

// encodeMessage appends the body of msg to dst. A message type that may
// carry tensors gets an encode session (returned, to roll back if the
// message is not sent); others need none.
func (n *Node) encodeMessage(dst []byte, msg any, peer string) (name string, ser uint8, body []byte, sess *encodeSession, err error) {
	if msg != nil && !carriesTensors(reflect.TypeOf(msg)) {
		name, ser, body, err = registry.AppendEncode(dst, msg)
		return name, ser, body, nil, err
	}
	sess = &encodeSession{n: n, peer: peer}
	var unbind func()
	name, ser, body, err = registry.EncodeWith(msg, func(enc *msgpack.Encoder) {
		unbind = tensor.BindEncoder(enc, sess)
	})
	if unbind != nil {
		unbind()
	}
	return name, ser, body, sess, err
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
	// hasTensors is an immutable reflect.Type → answer map, replaced
	// (copied) when a type is added: read once per message, written once
	// per type.
	hasTensors   atomic.Pointer[map[reflect.Type]*tensorCheck]
	hasTensorsMu sync.Mutex
	// lastTensorCheck is the answer given last: most traffic is of one
	// type, and comparing it costs less than a map lookup.
	lastTensorCheck atomic.Pointer[tensorCheck]
)

// tensorCheck is the carriesTensors answer for one type.
type tensorCheck struct {
	typ reflect.Type
	v   bool
}

// carriesTensors reports whether values of typ may hold tensors or Refs, so
// that messages without any skip the tensor session (the common, small
// message stays on the fastest path).
func carriesTensors(typ reflect.Type) bool {
	if l := lastTensorCheck.Load(); l != nil && l.typ == typ {
		return l.v
	}
	if m := hasTensors.Load(); m != nil {
		if c, ok := (*m)[typ]; ok {
			lastTensorCheck.Store(c)
			return c.v
		}
	}
	c := &tensorCheck{typ: typ, v: walkTensors(typ, map[reflect.Type]bool{})}
	hasTensorsMu.Lock()
	defer hasTensorsMu.Unlock()
	next := map[reflect.Type]*tensorCheck{typ: c}
	if m := hasTensors.Load(); m != nil {
		if len(*m) >= maxTensorTypes {
			return c.v // bounded: do not cache any more types
		}
		maps.Copy(next, *m)
	}
	hasTensors.Store(&next)
	return c.v
}

// maxTensorTypes bounds the carriesTensors cache (registered types and the
// few pointer or value forms they are sent as).
const maxTensorTypes = 4096

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
