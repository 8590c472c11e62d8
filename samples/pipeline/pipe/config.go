package pipe

import (
	"errors"
	"fmt"
)

// Config sizes a pipeline run.
type Config struct {
	Batches  int    // micro-batches
	Rows     int    // rows of one micro-batch
	Dim      int    // width of the input and of both activations
	Out      int    // width of the output
	InFlight int    // micro-batches in flight at once
	Seed     uint64 // seeds the weights and the inputs
}

// DefaultConfig returns what `go run ./samples/pipeline` uses: 32
// micro-batches of 64×512 float32 (128 KiB activations, so they move out of
// band), 8 in flight.
func DefaultConfig() Config {
	return Config{Batches: 32, Rows: 64, Dim: 512, Out: 256, InFlight: 8, Seed: 1}
}

// ErrConfig is wrapped by every error Validate returns.
var ErrConfig = errors.New("pipe: bad config")

// Validate checks c.
func (c *Config) Validate() error {
	const maxElems = 1 << 28
	switch {
	case c.Batches < 1:
		return fmt.Errorf("%w: %d micro-batches", ErrConfig, c.Batches)
	case c.Rows < 1 || c.Dim < 1 || c.Out < 1:
		return fmt.Errorf("%w: sizes %d×%d→%d", ErrConfig, c.Rows, c.Dim, c.Out)
	case int64(c.Rows)*int64(c.Dim) > maxElems || int64(c.Dim)*int64(max(c.Dim, c.Out)) > maxElems:
		return fmt.Errorf("%w: sizes %d×%d→%d too large", ErrConfig, c.Rows, c.Dim, c.Out)
	case c.InFlight < 1:
		return fmt.Errorf("%w: %d in flight", ErrConfig, c.InFlight)
	}
	return nil
}
