package transfer

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

type nested struct {
	A     *tensor.Tensor
	List  []*tensor.Tensor
	ByID  map[string]*tensor.Tensor
	Arr   [2]*tensor.Tensor
	R     tensor.Ref
	Next  *nested
	Plain []int
	hide  *tensor.Tensor // unexported: not encoded, not visited
}

type holder struct{ Any any }

type plain struct {
	N    int
	Name string
	Sub  struct{ B []byte }
}

func mk(t *testing.T, n int64) *tensor.Tensor {
	x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Free() })
	return x
}

// counter records the sizes of the tensors and the number of Refs visited.
type counter struct {
	sizes []int64
	refs  int
}

func (c *counter) visitTensor(t *tensor.Tensor) error {
	c.sizes = append(c.sizes, t.ByteSize())
	return nil
}

func (c *counter) visitRef(tensor.Ref) error { c.refs++; return nil }

func TestPlanFindsTensorFields(t *testing.T) {
	if HoldsTensors(reflect.TypeFor[*plain]()) || HoldsTensors(reflect.TypeFor[int]()) {
		t.Fatal("a type without tensors holds tensors")
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[*nested](), reflect.TypeFor[nested](), reflect.TypeFor[[]nested](),
		reflect.TypeFor[map[int]tensor.Ref](), reflect.TypeFor[*holder]()} {
		if !HoldsTensors(typ) {
			t.Errorf("%v: holds no tensors", typ)
		}
	}
	a, b, c, d, e := mk(t, 1), mk(t, 2), mk(t, 3), mk(t, 4), mk(t, 5)
	m := &nested{A: a, List: []*tensor.Tensor{b, nil}, ByID: map[string]*tensor.Tensor{"c": c}, Arr: [2]*tensor.Tensor{nil, d},
		R: tensor.NewRef(e), Next: &nested{A: mk(t, 6)}, hide: mk(t, 7)}
	var got counter
	if err := walk(m, &got); err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 2, 3, 4, 6}; !reflect.DeepEqual(got.sizes, want) || got.refs != 1 {
		t.Fatalf("visited %v and %d refs, want %v and 1", got.sizes, got.refs, want)
	}
}

func TestPlanErrors(t *testing.T) {
	noop := &counter{}
	cyc := &nested{}
	cyc.Next = cyc
	if err := walk(cyc, noop); !errors.Is(err, errTooDeep) {
		t.Fatalf("cycle: %v", err)
	}
	if err := walk(&holder{Any: mk(t, 1)}, noop); !errors.Is(err, errInInterface) {
		t.Fatalf("tensor in an interface: %v", err)
	}
	if err := walk(&holder{Any: 3}, noop); err != nil {
		t.Fatalf("int in an interface: %v", err)
	}
}

func TestCredits(t *testing.T) {
	c := newCredits(3, 100)
	ctx := context.Background()
	gone := make(chan struct{})
	for _, b := range []int64{60, 40} {
		if err := c.acquire(ctx, gone, b); err != nil {
			t.Fatal(err)
		}
	}
	ok, changed := c.tryAcquire(1)
	if ok {
		t.Fatal("acquired past the byte limit")
	}
	c.release(60)
	<-changed // a release wakes the waiters
	if err := c.acquire(ctx, gone, 50); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	c.release(40)
	c.release(50)
	// Larger than the limit: goes alone.
	if err := c.acquire(ctx, gone, 500); err != nil {
		t.Fatal(err)
	}
	close(gone)
	if err := c.acquire(ctx, gone, 1); !errors.Is(err, ErrPeerDown) {
		t.Fatalf("acquired while a huge message is in flight and the peer is gone: %v", err)
	}
}

func TestBudgetInOrder(t *testing.T) {
	b := newBudget(100)
	ctx := context.Background()
	if err := b.acquire(ctx, nil, 80); err != nil {
		t.Fatal(err)
	}
	granted := make(chan int64, 2)
	for _, n := range []int64{50, 10} {
		go func() {
			if err := b.acquire(ctx, nil, n); err == nil {
				granted <- n
			}
		}()
		waitFor(t, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiters) > 0 && b.waiters[len(b.waiters)-1].n == n
		})
	}
	// 10 would fit, but 50 came first: nothing is granted out of order.
	select {
	case n := <-granted:
		t.Fatalf("%d granted before the first waiter", n)
	default:
	}
	b.release(80)
	if a, c := <-granted, <-granted; a+c != 60 || b.inUse() != 60 {
		t.Fatalf("granted %d and %d, in use %d", a, c, b.inUse())
	}
	ctx2, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- b.acquire(ctx2, nil, 100) }()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.waiters) == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) || b.inUse() != 60 {
		t.Fatalf("cancelled waiter: %v, in use %d", err, b.inUse())
	}
}

// waitFor waits for cond, which other goroutines make true (no sleeping:
// it yields until then).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-t.Context().Done():
			t.Fatal("condition never held")
		default:
		}
		runtimeGosched()
	}
}
