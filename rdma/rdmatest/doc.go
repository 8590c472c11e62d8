// Package rdmatest is the conformance suite every data channel passes, and
// the harnesses that build the two ends of a transfer for it: in one process
// over TCP loopback (InProcessPair), on one node (SameNodePair), or with the
// owner in a child process (ChildOwner, for GPU tests across processes).
//
//	func TestStaging(t *testing.T) {
//		rdmatest.TestChannel(t, func(t *testing.T) *rdmatest.Pair {
//			return rdmatest.InProcessPair(t, newStaging, memory.CPU, memory.CPU)
//		})
//	}
//
// The data of every transfer is the pseudo-random stream Fill(seed, ...), so
// that an owner in another process can produce it from the seed alone.
package rdmatest
