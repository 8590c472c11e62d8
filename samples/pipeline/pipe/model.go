package pipe

import (
	"math"
	"math/rand/v2"
)

// The three stages of the model, as plain functions on row-major float32
// matrices. The actors and the in-process reference both call exactly these,
// so their results are equal bit for bit.
//
//	a1 = relu(x·W1)          stage 1
//	a2 = relu(a1·W2)         stage 2
//	y  = (a2 + a1)·W3        stage 3 (a1 arrives through a forwarded Ref: a residual connection)

// matmul returns x·w for x of rows×k and w of k×n.
func matmul(x, w []float32, rows, k, n int) []float32 {
	out := make([]float32, rows*n)
	for i := range rows {
		o := out[i*n : (i+1)*n]
		for p := range k {
			a := x[i*k+p]
			if a == 0 {
				continue
			}
			wr := w[p*n : (p+1)*n]
			for j := range o {
				o[j] += a * wr[j]
			}
		}
	}
	return out
}

func relu(x []float32) []float32 {
	for i, v := range x {
		if v < 0 {
			x[i] = 0
		}
	}
	return x
}

// Stage1 computes relu(x·W1).
func Stage1(c *Config, x, w1 []float32) []float32 { return relu(matmul(x, w1, c.Rows, c.Dim, c.Dim)) }

// Stage2 computes relu(a1·W2).
func Stage2(c *Config, a1, w2 []float32) []float32 { return relu(matmul(a1, w2, c.Rows, c.Dim, c.Dim)) }

// Stage3 computes (a2 + a1)·W3.
func Stage3(c *Config, a2, a1, w3 []float32) []float32 {
	s := make([]float32, len(a2))
	for i := range s {
		s[i] = a2[i] + a1[i]
	}
	return matmul(s, w3, c.Rows, c.Dim, c.Out)
}

// Weights returns stage i's weight matrix (1, 2: Dim×Dim; 3: Dim×Out),
// uniform in ±1/√Dim, drawn from the seed.
func Weights(c *Config, stage int) []float32 {
	n := c.Dim
	if stage == 3 {
		n = c.Out
	}
	return random(c.Seed, uint64(stage), c.Dim*n, 1/math.Sqrt(float64(c.Dim)))
}

// InputBatch returns micro-batch b's input, Rows×Dim, uniform in ±1.
func InputBatch(c *Config, b int) []float32 {
	return random(c.Seed, 1000+uint64(b), c.Rows*c.Dim, 1)
}

// Reference computes micro-batch b's output in this process.
func Reference(c *Config, b int) []float32 {
	a1 := Stage1(c, InputBatch(c, b), Weights(c, 1))
	a2 := Stage2(c, a1, Weights(c, 2))
	return Stage3(c, a2, a1, Weights(c, 3))
}

func random(seed, stream uint64, n int, scale float64) []float32 {
	rng := rand.New(rand.NewPCG(seed, stream))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32((2*rng.Float64() - 1) * scale)
	}
	return out
}
