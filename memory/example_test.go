package memory_test

import (
	"context"
	"fmt"
	"math"

	"github.com/tensorferry/tensorferry/memory"
)

// Buffers on any device are copied with Copy: here host to host; with a
// GPU, the same call copies to, from or between devices.
func ExampleCopy() {
	dev, _ := memory.ParseDevice("cpu")
	a, _ := memory.AllocatorFor(dev)
	src, _ := a.Alloc(4)
	dst, _ := a.Alloc(4)
	defer src.Free()
	defer dst.Free()
	copy(src.Host(), []byte{1, 2, 3, 4})
	if err := memory.Copy(context.Background(), dst, src); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dst.Host(), dst.Device())
	// Output: [1 2 3 4] cpu
}

// Devices are written as "cpu", "pinned" and "cuda:N", in flags and YAML.
func ExampleParseDevice() {
	for _, s := range []string{"cpu", "pinned", "cuda:1", "gpu"} {
		dev, err := memory.ParseDevice(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(dev, dev.Kind, dev.IsHost())
	}
	// Output:
	// cpu host true
	// pinned pinned true
	// cuda:1 cuda false
	// error: memory: unknown device "gpu": want cpu, pinned or cuda:N
}

// A Slice is a view: it shares the buffer's memory and Allocation, and
// freeing it does nothing.
func ExampleBuffer_slice() {
	buf, _ := memory.NewHostBuffer(8)
	defer buf.Free()
	view, _ := buf.Slice(2, 4)
	copy(view.Host(), "abcd")
	fmt.Printf("%q %d %v\n", buf.Host(), view.Len(), view.Allocation() == buf.Allocation())
	if _, err := buf.Slice(6, 4); err != nil {
		fmt.Println(err)
	}
	// Output:
	// "\x00\x00abcd\x00\x00" 4 true
	// memory: range outside buffer: [6, 6+4) of 8 bytes
}

// Fill sets every byte of a buffer, on whatever device it lives.
func ExampleFill() {
	buf, _ := memory.NewHostBuffer(6)
	defer buf.Free()
	mid, _ := buf.Slice(1, 4)
	_ = memory.Fill(context.Background(), buf, 0xff)
	_ = memory.Fill(context.Background(), mid, 7)
	fmt.Println(buf.Host())
	// Output: [255 7 7 7 7 255]
}

// Checksum hashes a buffer's bytes (CRC-32C), copying device memory to the
// host first; the lend check compares two of them.
func ExampleChecksum() {
	a := memory.WrapHost([]byte("tensor bytes"))
	sum, _ := memory.Checksum(context.Background(), a)
	a.Host()[0] = 'T'
	again, _ := memory.Checksum(context.Background(), a)
	fmt.Printf("%08x %v\n", sum, sum == again)
	// Output: 9eae5446 false
}

// CheckRange is the bounds check of Slice and of the channels' offsets, safe
// against overflow.
func ExampleCheckRange() {
	fmt.Println(memory.CheckRange(0, 8, 8))
	fmt.Println(memory.CheckRange(4, math.MaxInt, 8))
	// Output:
	// <nil>
	// memory: range outside buffer: [4, 4+9223372036854775807) of 8 bytes
}

// OnFree tells a cache keyed by Allocation.ID that an allocation went away.
func ExampleOnFree() {
	buf, _ := memory.NewHostBuffer(64)
	id := buf.Allocation().ID
	cancel := memory.OnFree(func(a memory.Allocation) {
		if a.ID == id {
			fmt.Println("freed", a.Size, "bytes on", a.Device)
		}
	})
	defer cancel()
	buf.Free()
	// Output: freed 64 bytes on cpu
}

// countingRegistrar "registers" allocations by counting them; real ones pin
// host memory (HostRegistrar) or make RDMA memory regions.
type countingRegistrar struct{ registered, unregistered int }

type registration struct{ a memory.Allocation }

func (r registration) Allocation() memory.Allocation { return r.a }

func (c *countingRegistrar) Register(a memory.Allocation, _ string) (memory.Registration, error) {
	c.registered++
	return registration{a}, nil
}

func (c *countingRegistrar) Unregister(memory.Registration) error {
	c.unregistered++
	return nil
}

// A RegCache registers an allocation on its first Get and keeps it
// registered for the next ones; freeing the allocation drops it.
func ExampleNewRegCache() {
	r := &countingRegistrar{}
	cache := memory.NewRegCache("example", r, memory.RegBudget{})
	defer cache.Close()
	buf, _ := memory.NewHostBuffer(4096)
	for range 3 {
		_, release, err := cache.Get(buf.Allocation(), "")
		if err != nil {
			fmt.Println(err)
			return
		}
		release() // the registration stays, idle
	}
	st := cache.Stats()
	fmt.Println(st.Misses, st.Hits, r.registered)
	buf.Free()
	fmt.Println(cache.Stats().Registered, r.unregistered)
	// Output:
	// 1 2 1
	// 0 1
}
