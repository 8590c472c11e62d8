package kernels

import _ "embed"

// PTX is the text of every kernel (.version 7.0, .target sm_70).
//
//go:embed kernels.ptx
var PTX string

// Kernel entry names in PTX and their parameters, in order. n is the number
// of float32 elements; pointers are device pointers.
const (
	Axpy  = "axpy"  // (y *f32, x *f32, a f32, n u64): y[i] += a*x[i]
	Scale = "scale" // (x *f32, a f32, n u64): x[i] *= a
	Add   = "add"   // (z *f32, x *f32, y *f32, n u64): z[i] = x[i] + y[i]
	SGD   = "sgd"   // (w *f32, g *f32, lr f32, n u64): w[i] -= lr*g[i]
)

// Names lists every kernel in PTX.
var Names = []string{Axpy, Scale, Add, SGD}
