//go:build !tfdebug

package owner

// Enabled reports whether the checks are compiled in (tag tfdebug).
const Enabled = false

// Goroutine is the goroutine that owns some state; without the tag
// tfdebug it records nothing and its methods do nothing.
type Goroutine struct{}

// Bind makes the calling goroutine the owner (again, after a hand-over).
func (*Goroutine) Bind() {}

// Check panics, with the tag tfdebug, unless the calling goroutine is the
// owner.
func (*Goroutine) Check() {}
