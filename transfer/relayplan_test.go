package transfer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestPlanRelay(t *testing.T) {
	o := RelayMember{Node: "o", Host: "h0", GPU: 0}
	m := func(host string, gpu int) RelayMember { return RelayMember{Host: host, GPU: gpu} }
	for _, tc := range []struct {
		name   string
		rs     []RelayMember
		fanout int
		want   []int
	}{
		{"none", nil, 2, []int{}},
		{"one", []RelayMember{m("h0", 1)}, 2, []int{RelayOwner}},
		// Three receivers on GPU 1: one crosses NVLink, the others copy on GPU 1.
		{"three on another GPU, chain", []RelayMember{m("h0", 1), m("h0", 1), m("h0", 1)}, 1, []int{RelayOwner, 0, 1}},
		{"three on another GPU, fanout 2", []RelayMember{m("h0", 1), m("h0", 1), m("h0", 1)}, 2, []int{RelayOwner, 0, 0}},
		{"same GPU as owner", []RelayMember{m("h0", 0), m("h0", 0), m("h0", 0)}, 2, []int{RelayOwner, RelayOwner, 0}},
		// GPU 0 members under the owner; GPU 1's head under the owner, its others under it.
		{"both GPUs", []RelayMember{m("h0", 1), m("h0", 0), m("h0", 1), m("h0", 0)}, 1, []int{RelayOwner, RelayOwner, 0, 1}},
		// One fetch per other host; the rest of h1 from its head.
		{"two hosts", []RelayMember{m("h1", 0), m("h1", 0), m("h0", 1), m("h1", 1)}, 2, []int{RelayOwner, 0, RelayOwner, 0}},
		{"three hosts, chain of heads", []RelayMember{m("h1", 0), m("h2", 0), m("h3", 0)}, 1, []int{RelayOwner, 0, 1}},
		// GPU heads chain whatever the fanout: each GPU's link out carries it once.
		{"three other GPUs, a chain", []RelayMember{m("h0", 1), m("h0", 2), m("h0", 3), m("h0", 2)}, 4, []int{RelayOwner, 0, 1, 1}},
		{"fanout below one is a chain", []RelayMember{m("h0", 1), m("h0", 1)}, 0, []int{RelayOwner, 0}},
		{"host memory", []RelayMember{m("h0", -1), m("h0", -1), m("h1", -1)}, 1, []int{RelayOwner, 0, RelayOwner}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanRelay(o, tc.rs, tc.fanout)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("PlanRelay = %v, want %v", got, tc.want)
			}
			checkPlan(t, o, tc.rs, tc.fanout, got)
		})
	}
}

// checkPlan checks what every plan must hold: a tree rooted at the owner,
// one fetch across hosts per host other than the owner's, at most one
// fetch into each GPU of a host from another GPU, and at most fanout
// children per holder on each kind of link.
func checkPlan(t *testing.T, o RelayMember, rs []RelayMember, fanout int, parent []int) {
	t.Helper()
	if len(parent) != len(rs) {
		t.Fatalf("%d parents for %d receivers", len(parent), len(rs))
	}
	at := func(i int) RelayMember {
		if i == RelayOwner {
			return o
		}
		return rs[i]
	}
	crossHost := map[string]int{}
	crossGPU := map[string]int{}
	kids := map[string]int{}
	for i, p := range parent {
		if p < RelayOwner || p >= len(rs) || p == i {
			t.Fatalf("receiver %d: parent %d", i, p)
		}
		// Reaches the owner within len(rs) steps: no cycle.
		q, n := p, 0
		for ; q != RelayOwner && n <= len(rs); n++ {
			q = parent[q]
		}
		if q != RelayOwner {
			t.Fatalf("receiver %d: no path to the owner in %v", i, parent)
		}
		r, src := rs[i], at(p)
		kind := "gpu"
		switch {
		case r.Host != src.Host:
			kind = "host"
			crossHost[r.Host]++
		case r.GPU != src.GPU:
			kind = "nvlink"
			crossGPU[fmt.Sprint(r.Host, r.GPU)]++
		}
		kids[fmt.Sprint(p, kind)]++
	}
	for h, n := range crossHost {
		if h == o.Host || n != 1 {
			t.Fatalf("host %s: %d fetches across hosts", h, n)
		}
	}
	for g, n := range crossGPU {
		if n != 1 {
			t.Fatalf("GPU %s: %d fetches from other GPUs", g, n)
		}
	}
	for k, n := range kids {
		if strings.HasSuffix(k, "nvlink") && n > 1 {
			t.Fatalf("holder %s: %d children on other GPUs, want a chain", k, n)
		}
		if n > max(fanout, 1) {
			t.Fatalf("holder/link %s: %d children, fanout %d", k, n, fanout)
		}
	}
}

func TestPlanRelayRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		o := RelayMember{Host: fmt.Sprint("h", rng.IntN(3)), GPU: rng.IntN(3) - 1}
		rs := make([]RelayMember, rng.IntN(20))
		for i := range rs {
			rs[i] = RelayMember{Node: fmt.Sprint("n", i), Host: fmt.Sprint("h", rng.IntN(3)), GPU: rng.IntN(3) - 1}
		}
		fanout := rng.IntN(4)
		checkPlan(t, o, rs, fanout, PlanRelay(o, rs, fanout))
	}
}
