// Package owner checks, in debug builds (go build -tags tfdebug), that
// state owned by one goroutine is touched only by it, as x/net/http2's
// serverConn checks its serve goroutine: the owner calls Bind once, and
// every access calls Check, which panics on another goroutine. In other
// builds Goroutine is an empty struct and both calls compile to nothing.
//
//	type reader struct {
//		owner owner.Goroutine
//		buf   []byte // owned by the reading goroutine
//	}
//
//	func (r *reader) loop() { r.owner.Bind(); ... }
//	func (r *reader) fill()  { r.owner.Check(); r.buf = ... }
package owner
