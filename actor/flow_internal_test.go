package actor

import (
	"context"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/tensor"
)

type nested struct {
	A    *tensor.Tensor
	List []*tensor.Tensor
	ByID map[string]*tensor.Tensor
	Any  any
	R    tensor.Ref
	Next *nested
	hide *tensor.Tensor // unexported: not encoded, not counted
}

func TestTensorBytes(t *testing.T) {
	mk := func(n int64) *tensor.Tensor {
		x, err := tensor.New(memory.CPU, tensor.Uint8, tensor.Shape{n})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = x.Free() })
		return x
	}
	big, small := mk(1000), mk(10)
	m := &nested{
		A:    big,
		List: []*tensor.Tensor{big, small, nil, mk(2000)},
		ByID: map[string]*tensor.Tensor{"x": mk(3000), "y": small},
		Any:  mk(4000),
		hide: mk(5000),
	}
	m.Next = m // a cycle
	// big counts once however often it appears; small ones are inline.
	if got, want := tensorBytes(m, 100), int64(1000+2000+3000+4000); got != want {
		t.Errorf("tensorBytes = %d, want %d", got, want)
	}
	if got := tensorBytes(&nested{}, 100); got != 0 {
		t.Errorf("empty message: %d", got)
	}
	if got := tensorBytes(nil, 100); got != 0 {
		t.Errorf("nil: %d", got)
	}
}

func TestCredits(t *testing.T) {
	c := newCredits(3, 100)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	gone := make(chan struct{})
	for _, b := range []int64{60, 40} {
		if err := c.acquire(ctx, gone, b); err != nil {
			t.Fatal(err)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if err := c.acquire(short, gone, 1); err == nil {
		t.Fatal("acquired past the byte budget")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		c.release(60)
	}()
	if err := c.acquire(ctx, gone, 50); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	c.release(40)
	c.release(50)
	// Larger than the budget: goes alone.
	if err := c.acquire(ctx, gone, 500); err != nil {
		t.Fatal(err)
	}
	close(gone)
	if err := c.acquire(ctx, gone, 1); err == nil {
		t.Fatal("acquired while a huge message is in flight and the peer is gone")
	}
}
