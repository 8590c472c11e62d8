package wire

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tinylib/msgp/msgp"
	"google.golang.org/protobuf/proto"
)

// Serializer ids carried in Message.Ser.
const (
	SerMsgpack  uint8 = 1
	SerProtobuf uint8 = 2
)

// ErrUnknownType: a message type is not registered (AppendEncode, Decode) or
// arrived with a serializer other than the one registered for it.
var ErrUnknownType = errors.New("wire: unknown message type")

// Serializer turns user messages into bytes and back.
type Serializer interface {
	// ID is the serializer id carried in Message.Ser.
	ID() uint8
	// Name names the serializer in errors and logs.
	Name() string
	// Marshal encodes v.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes b into a new value of typ and returns a pointer to
	// it. The value must not keep b or a slice of it: b may be part of a
	// frame that the connection's next frame overwrites.
	Unmarshal(b []byte, typ reflect.Type) (any, error)
}

// MsgpackSerializer encodes Go values with msgpack (id SerMsgpack).
//
// A type whose pointer implements msgp.Marshaler and msgp.Unmarshaler (the
// methods tinylib/msgp's generator writes: run go generate with
// "//go:generate msgp -io=false" beside the message types) is encoded and
// decoded by those methods, without reflection. Other values go through
// vmihailenco/msgpack's reflection, which can be customised with its
// CustomEncoder and CustomDecoder interfaces. Both read and write the same
// bytes for the same struct (maps keyed by field name, or by the name in a
// msgpack tag, which both honour), so a body written by either decodes with
// the other; the generated code encodes a nil slice or map as an empty one
// unless its field is tagged allownil (msgpack:",allownil", which
// vmihailenco ignores), and integers in msgp's compact signed form, which
// vmihailenco reads back. Embedded structs are not interchangeable:
// vmihailenco inlines their fields, msgp nests them.
//
// Input is validated before decoding either way (see DecodeMsgpack):
// declared lengths and counts must fit in the bytes that are there and
// nesting is bounded, so neither decoder sizes an allocation from a count
// that the body does not back with bytes.
type MsgpackSerializer struct{}

// ID returns SerMsgpack.
func (MsgpackSerializer) ID() uint8 { return SerMsgpack }

// Name returns "msgpack".
func (MsgpackSerializer) Name() string { return "msgpack" }

// Marshal encodes v.
func (s MsgpackSerializer) Marshal(v any) ([]byte, error) { return s.AppendMarshal(nil, v) }

// AppendMarshal appends the encoding of v to dst.
func (MsgpackSerializer) AppendMarshal(dst []byte, v any) ([]byte, error) {
	if m, ok := v.(msgp.Marshaler); ok {
		return appendGenerated(dst, m)
	}
	return appendMsgpack(dst, v)
}

// Unmarshal decodes b into a new value of typ.
func (MsgpackSerializer) Unmarshal(b []byte, typ reflect.Type) (any, error) {
	p := reflect.New(typ).Interface()
	if u, ok := p.(msgp.Unmarshaler); ok {
		if err := decodeGenerated(b, u); err != nil {
			return nil, err
		}
		return p, nil
	}
	if err := DecodeMsgpack(b, p); err != nil {
		return nil, err
	}
	return p, nil
}

// sizeHintRoom is the free capacity below which appendGenerated grows its
// buffer by the message's size estimate first.
const sizeHintRoom = 256

// appendGenerated appends m's encoding to dst through its generated
// MarshalMsg, growing dst first by its size estimate when it has one and
// dst has less than sizeHintRoom free (with more, a small message fits
// without asking: the estimate costs an interface lookup per message).
func appendGenerated(dst []byte, m msgp.Marshaler) ([]byte, error) {
	if cap(dst)-len(dst) < sizeHintRoom {
		if s, ok := m.(msgp.Sizer); ok {
			dst = slices.Grow(dst, s.Msgsize())
		}
	}
	out, err := m.MarshalMsg(dst)
	if err != nil {
		return dst, fmt.Errorf("wire: msgpack encode %T: %w", m, err)
	}
	return out, nil
}

// decodeGenerated decodes b, exactly one value, with u's generated
// UnmarshalMsg, once checkMsgpack accepted b.
func decodeGenerated(b []byte, u msgp.Unmarshaler) error {
	if err := checkMsgpack(b, MaxMsgpackDepth); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBody, err)
	}
	rest, err := u.UnmarshalMsg(b)
	if err != nil {
		return fmt.Errorf("%w: decode %T: %w", ErrBadBody, u, err)
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: decode %T: %w", ErrBadBody, u, errMsgpackTrailing)
	}
	return nil
}

// ProtoSerializer encodes values implementing proto.Message (id
// SerProtobuf).
type ProtoSerializer struct{}

// ID returns SerProtobuf.
func (ProtoSerializer) ID() uint8 { return SerProtobuf }

// Name returns "protobuf".
func (ProtoSerializer) Name() string { return "protobuf" }

// Marshal encodes v, which must be a proto.Message.
func (ProtoSerializer) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("wire: protobuf: %T is not a proto.Message", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("wire: protobuf: marshal %T: %w", v, err)
	}
	return b, nil
}

// AppendMarshal appends the encoding of v, which must be a proto.Message,
// to dst.
func (ProtoSerializer) AppendMarshal(dst []byte, v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return dst, fmt.Errorf("wire: protobuf: %T is not a proto.Message", v)
	}
	out, err := proto.MarshalOptions{}.MarshalAppend(dst, m)
	if err != nil {
		return dst, fmt.Errorf("wire: protobuf: marshal %T: %w", v, err)
	}
	return out, nil
}

// appendMarshaler is a Serializer that can encode into a caller's buffer.
type appendMarshaler interface {
	AppendMarshal(dst []byte, v any) ([]byte, error)
}

// Unmarshal decodes b into a new value of typ, whose pointer must be a
// proto.Message.
func (ProtoSerializer) Unmarshal(b []byte, typ reflect.Type) (any, error) {
	p := reflect.New(typ).Interface()
	m, ok := p.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("wire: protobuf: %T is not a proto.Message", p)
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("wire: protobuf: unmarshal %T: %w", p, err)
	}
	return p, nil
}

var (
	protoMessageType    = reflect.TypeFor[proto.Message]()
	msgpMarshalerType   = reflect.TypeFor[msgp.Marshaler]()
	msgpUnmarshalerType = reflect.TypeFor[msgp.Unmarshaler]()
)

// RegisteredType is one registration of a Registry (Registry.Type): a
// caller that decodes many messages of one type looks it up once and
// decodes through it, without Decode's lookup by name per message.
type RegisteredType struct {
	name string
	typ  reflect.Type // the value type (not a pointer)
	ser  Serializer
	// gen: ser is MsgpackSerializer and *typ has msgp's generated
	// MarshalMsg and UnmarshalMsg, which encode and decode it.
	gen bool
}

// Registry maps message type names to Go types and their serializers. It
// is safe for concurrent use. Both ends must register the same names.
//
// Lookups, one per message sent or received, read an immutable snapshot
// without locking; Register copies the tables (registration is rare).
type Registry struct {
	mu     sync.Mutex // serializes Register
	tables atomic.Pointer[registryTables]
	last   atomic.Pointer[RegisteredType] // the type encoded last: most senders send one type
}

type registryTables struct {
	byName map[string]*RegisteredType
	byType map[reflect.Type]*RegisteredType
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.tables.Store(&registryTables{byName: map[string]*RegisteredType{}, byType: map[reflect.Type]*RegisteredType{}})
	return r
}

// Register registers the type of sample (a value or a pointer to one)
// under name. Values whose pointer implements proto.Message use the
// protobuf serializer, others msgpack. Registering the same name and type
// again is a no-op; reusing a name or type for something else is an error.
func (r *Registry) Register(name string, sample any) error {
	if name == "" || sample == nil {
		return errors.New("wire: register: empty name or nil sample")
	}
	typ := reflect.TypeOf(sample)
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var ser Serializer = MsgpackSerializer{}
	if reflect.PointerTo(typ).Implements(protoMessageType) {
		ser = ProtoSerializer{}
	}
	return r.RegisterSerializer(name, sample, ser)
}

// RegisterSerializer is Register with an explicit serializer.
func (r *Registry) RegisterSerializer(name string, sample any, ser Serializer) error {
	if name == "" || sample == nil || ser == nil {
		return errors.New("wire: register: empty name, nil sample or nil serializer")
	}
	typ := reflect.TypeOf(sample)
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.tables.Load()
	if rt, ok := old.byName[name]; ok {
		if rt.typ == typ && rt.ser.ID() == ser.ID() {
			return nil
		}
		return fmt.Errorf("wire: register %q: name already used by %v", name, rt.typ)
	}
	if rt, ok := old.byType[typ]; ok {
		return fmt.Errorf("wire: register %q: type %v already registered as %q", name, typ, rt.name)
	}
	rt := &RegisteredType{name: name, typ: typ, ser: ser}
	if _, ok := ser.(MsgpackSerializer); ok {
		pt := reflect.PointerTo(typ)
		rt.gen = pt.Implements(msgpMarshalerType) && pt.Implements(msgpUnmarshalerType)
	}
	t := &registryTables{byName: maps.Clone(old.byName), byType: maps.Clone(old.byType)}
	t.byName[name] = rt
	t.byType[typ] = rt
	r.tables.Store(t)
	return nil
}

// MustRegister is Register that panics on error, for package init.
func (r *Registry) MustRegister(name string, sample any) {
	if err := r.Register(name, sample); err != nil {
		panic(err)
	}
}

// AppendEncode serializes msg (a registered type or a pointer to one),
// appending the body to dst (which may be nil or a reused buffer), and
// returns its type name, serializer id and the extended slice. An
// unregistered type gives ErrUnknownType.
func (r *Registry) AppendEncode(dst []byte, msg any) (typeName string, ser uint8, body []byte, err error) {
	rt, err := r.lookupValue(msg)
	if err != nil {
		return "", 0, dst, err
	}
	if rt.gen {
		m, ok := msg.(msgp.Marshaler)
		if !ok { // a value whose MarshalMsg has a pointer receiver
			p := reflect.New(rt.typ)
			p.Elem().Set(reflect.ValueOf(msg))
			m = p.Interface().(msgp.Marshaler)
		}
		if body, err = appendGenerated(dst, m); err != nil {
			return "", 0, dst, err
		}
		return rt.name, SerMsgpack, body, nil
	}
	if am, ok := rt.ser.(appendMarshaler); ok {
		body, err = am.AppendMarshal(dst, msg)
	} else {
		var b []byte
		if b, err = rt.ser.Marshal(msg); err == nil {
			body = append(dst, b...)
		}
	}
	if err != nil {
		return "", 0, dst, err
	}
	return rt.name, rt.ser.ID(), body, nil
}

// lookupValue returns the registration of msg's type.
func (r *Registry) lookupValue(msg any) (*RegisteredType, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrUnknownType)
	}
	typ := reflect.TypeOf(msg)
	isPtr := typ.Kind() == reflect.Pointer
	if isPtr {
		typ = typ.Elem()
	}
	rt := r.last.Load()
	if rt == nil || rt.typ != typ {
		var ok bool
		if rt, ok = r.tables.Load().byType[typ]; !ok {
			return nil, fmt.Errorf("%w: %v is not registered", ErrUnknownType, typ)
		}
		r.last.Store(rt)
	}
	if isPtr && reflect.ValueOf(msg).IsNil() {
		return nil, fmt.Errorf("wire: encode: nil %T", msg)
	}
	return rt, nil
}

// Decode decodes body as the type registered under typeName and returns a
// pointer to a new value. An unknown name, or a serializer id other than
// the registered one, gives ErrUnknownType.
func (r *Registry) Decode(typeName string, ser uint8, body []byte) (any, error) {
	rt, ok := r.tables.Load().byName[typeName]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownType, typeName)
	}
	return rt.Decode(ser, body)
}

// Type returns the registration of typeName.
func (r *Registry) Type(typeName string) (*RegisteredType, bool) {
	rt, ok := r.tables.Load().byName[typeName]
	return rt, ok
}

// Name returns the name the type is registered under.
func (rt *RegisteredType) Name() string { return rt.name }

// Type returns the registered Go type (not a pointer).
func (rt *RegisteredType) Type() reflect.Type { return rt.typ }

// Decode decodes body, which arrived with serializer ser, as the type and
// returns a pointer to a new value, as Registry.Decode does.
func (rt *RegisteredType) Decode(ser uint8, body []byte) (any, error) {
	if rt.ser.ID() != ser {
		return nil, fmt.Errorf("%w: %q arrived with serializer %d, registered with %d (%s)", ErrUnknownType, rt.name, ser, rt.ser.ID(), rt.ser.Name())
	}
	v, err := rt.ser.Unmarshal(body, rt.typ)
	if err != nil {
		return nil, fmt.Errorf("wire: decode %q: %w", rt.name, err)
	}
	return v, nil
}
