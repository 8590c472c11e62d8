package staging_test

import (
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/rdma/rdmatest"
	"github.com/tensorferry/tensorferry/rdma/staging"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newChannel(env *rdma.Env) (rdma.Channel, error) { return staging.New(env) }

func TestConformanceHost(t *testing.T) {
	rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
		return rdmatest.InProcessPair(t, newChannel, memory.CPU, memory.CPU)
	})
}
