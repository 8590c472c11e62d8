package transfer

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/tensorferry/tensorferry/tensor"
)

// A plan knows, for one Go type, where its values may hold tensors: the
// *tensor.Tensor and tensor.Ref fields, in nested structs, pointers,
// slices, arrays and map values. It is made once per type (when a message
// type is registered, or at its first send) and then walks values without
// looking at fields that cannot hold tensors.
type plan struct {
	typ   reflect.Type
	visit func(v reflect.Value, w *walker) error // nil: the type holds no tensors
}

// visitor is what a walk calls for each tensor and non-empty Ref found.
type visitor interface {
	visitTensor(t *tensor.Tensor) error
	visitRef(r tensor.Ref) error
}

// walker is one walk over a message: its visitor and the nesting depth.
type walker struct {
	v     visitor
	depth int
}

// maxDepth bounds the nesting a walk follows (cyclic values end there).
const maxDepth = 32

var (
	errTooDeep     = errors.New("transfer: message nested deeper than 32 levels (a cycle?)")
	errInInterface = errors.New("transfer: a tensor or Ref inside an interface field is not supported: declare the field as *tensor.Tensor or tensor.Ref")

	tensorPtrType = reflect.TypeFor[*tensor.Tensor]()
	tensorType    = reflect.TypeFor[tensor.Tensor]()
	refType       = reflect.TypeFor[tensor.Ref]()
)

var (
	plansMu sync.Mutex
	plans   sync.Map // reflect.Type → *plan
	// lastPlan is the plan returned last: most traffic is of one type.
	lastPlan atomic.Pointer[plan]
)

// maxPlans bounds the cache of plans (registered types and the few forms
// they are sent as; interface fields add the dynamic types they hold).
const maxPlans = 4096

// planFor returns the plan of typ, making it on first use.
func planFor(typ reflect.Type) *plan {
	if p := lastPlan.Load(); p != nil && p.typ == typ {
		return p
	}
	if p, ok := plans.Load(typ); ok {
		lastPlan.Store(p.(*plan))
		return p.(*plan)
	}
	plansMu.Lock()
	defer plansMu.Unlock()
	p := compile(typ, map[reflect.Type]*plan{})
	if n := planCount.Load(); n < maxPlans {
		if _, loaded := plans.LoadOrStore(typ, p); !loaded {
			planCount.Add(1)
		}
	}
	return p
}

var planCount atomic.Int64

// HoldsTensors reports whether values of typ may hold tensors or Refs,
// making the type's plan on first use (call it when a message type is
// registered to make it ahead of the first message).
func HoldsTensors(typ reflect.Type) bool { return planFor(typ).visit != nil }

// holds reports whether values of typ may hold tensors or Refs.
func holds(typ reflect.Type, seen map[reflect.Type]bool) bool {
	if typ == tensorType || typ == refType {
		return true
	}
	if seen[typ] {
		return false
	}
	seen[typ] = true
	switch typ.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return holds(typ.Elem(), seen)
	case reflect.Map:
		return holds(typ.Elem(), seen)
	case reflect.Interface:
		return true
	case reflect.Struct:
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() && holds(f.Type, seen) {
				return true
			}
		}
	}
	return false
}

// compile makes the plan of typ; memo holds the plans being made, so that
// recursive types refer to themselves.
func compile(typ reflect.Type, memo map[reflect.Type]*plan) *plan {
	if p, ok := memo[typ]; ok {
		return p
	}
	p := &plan{typ: typ}
	memo[typ] = p
	if !holds(typ, map[reflect.Type]bool{}) {
		return p
	}
	switch {
	case typ == tensorPtrType:
		p.visit = func(v reflect.Value, w *walker) error {
			if v.IsNil() {
				return nil
			}
			return w.v.visitTensor(v.Interface().(*tensor.Tensor))
		}
		return p
	case typ == tensorType:
		p.visit = func(v reflect.Value, w *walker) error {
			if !v.CanAddr() {
				return errors.New("transfer: a tensor.Tensor value that is not addressable: send a pointer to the message")
			}
			return w.v.visitTensor(v.Addr().Interface().(*tensor.Tensor))
		}
		return p
	case typ == refType:
		p.visit = func(v reflect.Value, w *walker) error {
			r := v.Interface().(tensor.Ref)
			if r.IsZero() {
				return nil
			}
			return w.v.visitRef(r)
		}
		return p
	}
	switch typ.Kind() {
	case reflect.Pointer:
		elem := compile(typ.Elem(), memo)
		p.visit = func(v reflect.Value, w *walker) error {
			if v.IsNil() {
				return nil
			}
			return w.nested(elem, v.Elem())
		}
	case reflect.Slice, reflect.Array:
		elem := compile(typ.Elem(), memo)
		p.visit = func(v reflect.Value, w *walker) error {
			for i := range v.Len() {
				if err := w.nested(elem, v.Index(i)); err != nil {
					return err
				}
			}
			return nil
		}
	case reflect.Map:
		elem := compile(typ.Elem(), memo)
		p.visit = func(v reflect.Value, w *walker) error {
			for it := v.MapRange(); it.Next(); {
				if err := w.nested(elem, it.Value()); err != nil {
					return err
				}
			}
			return nil
		}
	case reflect.Interface:
		p.visit = func(v reflect.Value, w *walker) error {
			if v.IsNil() {
				return nil
			}
			if planFor(v.Elem().Type()).visit != nil {
				return fmt.Errorf("%w (%s holds %s)", errInInterface, typ, v.Elem().Type())
			}
			return nil
		}
	case reflect.Struct:
		type field struct {
			index int
			plan  *plan
		}
		var fields []field
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.IsExported() && holds(f.Type, map[reflect.Type]bool{}) {
				fields = append(fields, field{i, compile(f.Type, memo)})
			}
		}
		p.visit = func(v reflect.Value, w *walker) error {
			for _, f := range fields {
				if err := w.nested(f.plan, v.Field(f.index)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return p
}

// nested visits v with p one level deeper.
func (w *walker) nested(p *plan, v reflect.Value) error {
	if p.visit == nil {
		return nil
	}
	if w.depth >= maxDepth {
		return errTooDeep
	}
	w.depth++
	err := p.visit(v, w)
	w.depth--
	return err
}

// walk calls v for every tensor and non-empty Ref of msg.
func walk(msg any, v visitor) error {
	w := walker{v: v}
	return w.walk(msg)
}

// walk calls w.v for every tensor and non-empty Ref of msg.
func (w *walker) walk(msg any) error {
	if msg == nil {
		return nil
	}
	rv := reflect.ValueOf(msg)
	return w.nested(planFor(rv.Type()), rv)
}
