//go:build tfdebug

package owner

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
)

// Enabled reports whether the checks are compiled in (tag tfdebug).
const Enabled = true

// Goroutine is the goroutine that owns some state; its zero value has none.
type Goroutine struct{ id atomic.Uint64 }

// Bind makes the calling goroutine the owner (again, after a hand-over).
func (g *Goroutine) Bind() { g.id.Store(current()) }

// Check panics unless the calling goroutine is the owner, or none is bound.
func (g *Goroutine) Check() {
	if id := g.id.Load(); id != 0 && id != current() {
		panic(fmt.Sprintf("owner: state of goroutine %d touched by goroutine %d", id, current()))
	}
}

// current is the calling goroutine's id, read from the first line of its
// stack trace ("goroutine 18 [running]:"): slow, for debug builds only.
func current() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		panic("owner: cannot read the goroutine id: " + err.Error())
	}
	return id
}
