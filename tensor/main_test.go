package tensor

import (
	"testing"

	"go.uber.org/goleak"
)

// The store's ttl timers run goroutines: none may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
