package ps

import (
	"math"
	"math/rand/v2"
)

// Truth returns w*, the known solution: Dim standard normal values drawn from
// the config's seed.
func Truth(c *Config) []float32 {
	rng := rand.New(rand.NewPCG(c.Seed, math.MaxUint64))
	w := make([]float32, c.Dim)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return w
}

// dataset is one worker's rows of the sparse design matrix X (CSR) and
// labels y = X·w* + noise.
type dataset struct {
	cols []int32   // column of each non-zero, NonZeros per row
	vals []float32 // value of each non-zero
	y    []float32
	nnz  int // non-zeros per row
}

// generate makes worker j's data. Every row has NonZeros entries ±s at
// random columns, with s² = Dim/NonZeros, so that E[XᵀX]/rows = I: the
// averaged gradient of the squared loss is well conditioned and a fixed
// learning rate below 1 converges.
func generate(c *Config, j int, truth []float32) *dataset {
	rng := rand.New(rand.NewPCG(c.Seed, uint64(j)))
	n, k := c.SamplesPerWorker, c.NonZeros
	s := float32(math.Sqrt(float64(c.Dim) / float64(k)))
	d := &dataset{cols: make([]int32, n*k), vals: make([]float32, n*k), y: make([]float32, n), nnz: k}
	for r := range n {
		var dot float64
		for e := r * k; e < (r+1)*k; e++ {
			col := rng.IntN(c.Dim)
			v := s
			if rng.Uint32()&1 == 0 {
				v = -s
			}
			d.cols[e], d.vals[e] = int32(col), v
			dot += float64(v) * float64(truth[col])
		}
		d.y[r] = float32(dot + c.Noise*rng.NormFloat64())
	}
	return d
}

// gradient writes g = Xᵀ(X·w − y)/rows and returns the loss ‖X·w − y‖²/(2·rows),
// both for the weights w. g has the length of w.
func (d *dataset) gradient(w, g []float32) float64 {
	clear(g)
	n := len(d.y)
	var loss float64
	for r := range n {
		lo, hi := r*d.nnz, (r+1)*d.nnz
		var dot float64
		for e := lo; e < hi; e++ {
			dot += float64(d.vals[e]) * float64(w[d.cols[e]])
		}
		res := dot - float64(d.y[r])
		loss += res * res
		rs := float32(res / float64(n))
		for e := lo; e < hi; e++ {
			g[d.cols[e]] += rs * d.vals[e]
		}
	}
	return loss / float64(2*n)
}

// Distance returns ‖w − truth‖ / ‖truth‖.
func Distance(w, truth []float32) float64 {
	var num, den float64
	for i := range truth {
		d := float64(w[i]) - float64(truth[i])
		num += d * d
		den += float64(truth[i]) * float64(truth[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
