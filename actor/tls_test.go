package actor_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/tensor"
)

// TestTLSCluster: two nodes of a cluster with TLS on control and data
// connections exchange requests and tensors fetched over the (encrypted)
// staging channel.
func TestTLSCluster(t *testing.T) {
	cfg, err := config.LocalConfig("tls", 2)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS, err = config.LocalTLS(t.TempDir(), true); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nodes := startNodes(t, cfg)
	a, b := nodes[0], nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Root().SpawnNamed(tensorProps(b), "tensors"); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int64{100, 1 << 20} { // inline, then out of band
		x := randomTensor(t, rng, tensor.Uint8, tensor.Shape{n})
		res, err := a.Root().RequestFuture(a.PID(b.Name(), "tensors"), &Grad{W: x}, 10*time.Second).Result()
		checkDigest(t, res, err, x)
		if err := x.WaitReleased(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.Stats().Channels["staging"]; st.Transfers != 1 {
		t.Errorf("staging transfers %d, want 1", st.Transfers)
	}
}
