package rdma_test

import (
	"strings"
	"testing"

	"github.com/tensorferry/tensorferry/memory"
	"github.com/tensorferry/tensorferry/rdma"
	_ "github.com/tensorferry/tensorferry/rdma/builtin"
	"github.com/tensorferry/tensorferry/rdma/verbs"
)

// node builds the Caps of a node running every channel.
func node(name, host string, gpus ...string) *rdma.Caps {
	c := &rdma.Caps{Node: name, Incarnation: 1, HostID: host, Channels: []string{rdma.Local, rdma.IPC, rdma.Verbs, rdma.Staging}}
	for i, uuid := range gpus {
		c.Devices = append(c.Devices, rdma.DeviceInfo{Device: memory.CUDA(i).String(), UUID: uuid})
	}
	return c
}

func with(c *rdma.Caps, f func(c *rdma.Caps)) *rdma.Caps { f(c); return c }

func disable(name, why string) func(c *rdma.Caps) {
	return func(c *rdma.Caps) {
		var keep []string
		for _, ch := range c.Channels {
			if ch != name {
				keep = append(keep, ch)
			}
		}
		c.Channels = keep
		if why != "" {
			if c.NotRunning == nil {
				c.NotRunning = map[string]string{}
			}
			c.NotRunning[name] = why
		}
	}
}

var (
	nic       = []verbs.Device{{Name: "mlx5_0", DMABuf: true}}
	nicPeer   = []verbs.Device{{Name: "mlx5_0", PeerMem: true}}
	nicNoGPU  = []verbs.Device{{Name: "rxe0"}}
	gpu0, cpu = memory.CUDA(0), memory.CPU
)

func TestSelect(t *testing.T) {
	tests := []struct {
		name         string
		owner, fetch *rdma.Caps
		src, dst     memory.Device
		want         string
		// reasons maps a rejected channel to words its reason must contain.
		reasons map[string][]string
	}{
		{
			name:  "same process",
			owner: node("a", "h1", "GPU-0"), fetch: node("a", "h1", "GPU-0"),
			src: gpu0, dst: gpu0, want: rdma.Local,
			reasons: map[string][]string{rdma.IPC: {"local preferred"}, rdma.Staging: {"local preferred"}},
		},
		{
			name:  "same process, host memory",
			owner: node("a", "h1"), fetch: node("a", "h1"),
			src: cpu, dst: cpu, want: rdma.Local,
		},
		{
			name:  "same name, new incarnation",
			owner: with(node("a", "h1", "GPU-0", "GPU-1"), func(c *rdma.Caps) { c.Incarnation = 2; c.P2P = [][2]string{{"GPU-0", "GPU-1"}} }),
			fetch: node("a", "h1", "GPU-0", "GPU-1"),
			src:   gpu0, dst: memory.CUDA(1), want: rdma.IPC,
			reasons: map[string][]string{rdma.Local: {"different processes"}},
		},
		{
			name:  "same host, P2P",
			owner: with(node("a", "h1", "GPU-0", "GPU-1"), func(c *rdma.Caps) { c.P2P = [][2]string{{"GPU-0", "GPU-1"}} }),
			fetch: with(node("b", "h1", "GPU-0", "GPU-1"), func(c *rdma.Caps) { c.P2P = [][2]string{{"GPU-0", "GPU-1"}} }),
			src:   gpu0, dst: memory.CUDA(1), want: rdma.IPC,
			reasons: map[string][]string{rdma.Local: {"different processes"}, rdma.Verbs: {"ipc preferred"}, rdma.Staging: {"ipc preferred"}},
		},
		{
			name:  "same host, P2P reported by the fetcher only, reversed pair",
			owner: node("a", "h1", "GPU-0", "GPU-1"),
			fetch: with(node("b", "h1", "GPU-0", "GPU-1"), func(c *rdma.Caps) { c.P2P = [][2]string{{"GPU-0", "GPU-1"}} }),
			src:   memory.CUDA(1), dst: gpu0, want: rdma.IPC,
		},
		{
			name:  "same host, same GPU",
			owner: node("a", "h1", "GPU-0"), fetch: node("b", "h1", "GPU-0"),
			src: gpu0, dst: gpu0, want: rdma.IPC,
		},
		{
			name:  "same host, no P2P",
			owner: node("a", "h1", "GPU-0", "GPU-1"), fetch: node("b", "h1", "GPU-0", "GPU-1"),
			src: gpu0, dst: memory.CUDA(1), want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"no P2P", "GPU-0", "GPU-1"}, rdma.Verbs: {"no RDMA device"}},
		},
		{
			name:  "same host, GPU not advertised",
			owner: node("a", "h1"), fetch: node("b", "h1", "GPU-0"),
			src: gpu0, dst: gpu0, want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"UUID unknown"}},
		},
		{
			name:  "same host, host memory never ipc",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { c.P2P = [][2]string{{"GPU-0", "GPU-0"}} }),
			fetch: node("b", "h1", "GPU-0"),
			src:   cpu, dst: gpu0, want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"needs GPU memory", "cpu"}},
		},
		{
			name:  "same host, pinned memory never ipc",
			owner: node("a", "h1", "GPU-0"), fetch: node("b", "h1", "GPU-0"),
			src: gpu0, dst: memory.Pinned, want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"needs GPU memory"}},
		},
		{
			name:  "empty host ids are not the same host",
			owner: node("a", "", "GPU-0"), fetch: node("b", "", "GPU-0"),
			src: gpu0, dst: gpu0, want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"different hosts"}},
		},
		{
			name:  "different hosts, RDMA with dmabuf",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			fetch: with(node("b", "h2", "GPU-9"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			src:   gpu0, dst: gpu0, want: rdma.Verbs,
			reasons: map[string][]string{rdma.IPC: {"different hosts"}, rdma.Staging: {"verbs preferred"}},
		},
		{
			name:  "different hosts, RDMA with peer memory",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { verbs.SetDevices(c, nicPeer) }),
			fetch: with(node("b", "h2", "GPU-9"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			src:   gpu0, dst: gpu0, want: rdma.Verbs,
		},
		{
			name:  "GPU source without dmabuf or peer memory",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { verbs.SetDevices(c, nicNoGPU) }),
			fetch: with(node("b", "h2", "GPU-9"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			src:   gpu0, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"a cannot register GPU memory"}},
		},
		{
			name:  "GPU destination without dmabuf or peer memory",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			fetch: with(node("b", "h2", "GPU-9"), func(c *rdma.Caps) { verbs.SetDevices(c, nicNoGPU) }),
			src:   cpu, dst: gpu0, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"b cannot register GPU memory"}},
		},
		{
			name:  "host memory over RDMA needs no GPU registration",
			owner: with(node("a", "h1"), func(c *rdma.Caps) { verbs.SetDevices(c, nicNoGPU) }),
			fetch: with(node("b", "h2"), func(c *rdma.Caps) { verbs.SetDevices(c, nicNoGPU) }),
			src:   cpu, dst: cpu, want: rdma.Verbs,
		},
		{
			name:  "RDMA at one end only",
			owner: with(node("a", "h1"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			fetch: node("b", "h2"),
			src:   cpu, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"no RDMA device"}},
		},
		{
			name:  "ipc disabled at the fetcher",
			owner: with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { c.P2P = [][2]string{{"GPU-0", "GPU-0"}} }),
			fetch: with(node("b", "h1", "GPU-0"), disable(rdma.IPC, "disabled in config")),
			src:   gpu0, dst: gpu0, want: rdma.Staging,
			reasons: map[string][]string{rdma.IPC: {"b does not run it", "disabled in config"}},
		},
		{
			name:  "verbs not viable at the owner",
			owner: with(node("a", "h1"), func(c *rdma.Caps) { verbs.SetDevices(c, nic); disable(rdma.Verbs, "no libibverbs.so.1")(c) }),
			fetch: with(node("b", "h2"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			src:   cpu, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"a does not run it", "libibverbs"}},
		},
		{
			name:  "channel missing without a reason",
			owner: node("a", "h1"),
			fetch: with(node("b", "h2"), disable(rdma.Verbs, "")),
			src:   cpu, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"b does not run it", "not enabled"}},
		},
		{
			name:  "local disabled: the next channel that reaches",
			owner: with(node("a", "h1"), disable(rdma.Local, "disabled in the config")),
			fetch: with(node("a", "h1"), disable(rdma.Local, "disabled in the config")),
			src:   cpu, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Local: {"a does not run it", "disabled in the config"}, rdma.IPC: {"needs GPU memory"}},
		},
		{
			name:  "malformed RDMA advertisement",
			owner: with(node("a", "h1"), func(c *rdma.Caps) { c.Ads = map[string][]byte{rdma.Verbs: {0xc1}} }),
			fetch: with(node("b", "h2"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) }),
			src:   cpu, dst: cpu, want: rdma.Staging,
			reasons: map[string][]string{rdma.Verbs: {"a: verbs: malformed RDMA device list"}},
		},
		{
			name:  "staging disabled too: nothing",
			owner: with(node("a", "h1"), disable(rdma.Staging, "disabled in config")),
			fetch: node("b", "h2"),
			src:   cpu, dst: cpu, want: "",
			reasons: map[string][]string{rdma.Staging: {"a does not run it"}, rdma.Local: {"different processes"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := rdma.Select(tc.owner, tc.fetch, tc.src, tc.dst)
			if got.Channel != tc.want {
				t.Fatalf("chose %q, want %q (rejected: %+v)", got.Channel, tc.want, got.Rejected)
			}
			if c := rdma.Choose(tc.owner, tc.fetch, tc.src, tc.dst); c != got.Channel {
				t.Fatalf("Choose = %q, Select chose %q", c, got.Channel)
			}
			// Every channel is either chosen or rejected once, with a reason.
			seen := map[string]int{}
			if got.Channel != "" {
				seen[got.Channel]++
			}
			reasons := map[string]string{}
			for _, r := range got.Rejected {
				seen[r.Channel]++
				reasons[r.Channel] = r.Reason
				if r.Reason == "" {
					t.Errorf("%s rejected without a reason", r.Channel)
				}
			}
			for _, b := range rdma.Backends() {
				if name := b.Name; seen[name] != 1 {
					t.Errorf("%s appears %d times in %+v", name, seen[name], got)
				}
			}
			for ch, words := range tc.reasons {
				for _, w := range words {
					if !strings.Contains(reasons[ch], w) {
						t.Errorf("%s rejected with %q, want it to mention %q", ch, reasons[ch], w)
					}
				}
			}
		})
	}
}

func TestSelectIsSymmetricInWhatBothEndsSee(t *testing.T) {
	// Both ends run rdma.Select on the same inputs and must agree: it is pure.
	a := with(node("a", "h1", "GPU-0"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) })
	b := with(node("b", "h2", "GPU-1"), func(c *rdma.Caps) { verbs.SetDevices(c, nic) })
	first := rdma.Select(a, b, gpu0, gpu0)
	for range 10 {
		again := rdma.Select(a, b, gpu0, gpu0)
		if again.Channel != first.Channel || len(again.Rejected) != len(first.Rejected) {
			t.Fatalf("Select is not deterministic: %+v vs %+v", first, again)
		}
		for i := range again.Rejected {
			if again.Rejected[i] != first.Rejected[i] {
				t.Fatalf("Select is not deterministic: %+v vs %+v", first, again)
			}
		}
	}
}

func TestCapsRuns(t *testing.T) {
	c := node("a", "h")
	if !c.Runs(rdma.Staging) || c.Runs("carrier-pigeon") {
		t.Error("Runs")
	}
}

func TestDirectSmall(t *testing.T) {
	p2p := func(pairs ...[2]string) func(c *rdma.Caps) {
		return func(c *rdma.Caps) { c.P2P = pairs }
	}
	tests := []struct {
		name         string
		owner, fetch *rdma.Caps
		src          memory.Device
		want         string
	}{
		{"same host, same GPU", node("a", "h1", "GPU-0"), node("b", "h1", "GPU-0"), gpu0, rdma.IPC},
		{"same host, every GPU of the peer reached",
			with(node("a", "h1", "GPU-0", "GPU-1"), p2p([2]string{"GPU-0", "GPU-1"})),
			node("b", "h1", "GPU-1", "GPU-0"), gpu0, rdma.IPC},
		{"one GPU of the peer out of reach",
			node("a", "h1", "GPU-0", "GPU-1"), node("b", "h1", "GPU-1", "GPU-0"), gpu0, ""},
		{"host tensor", node("a", "h1", "GPU-0"), node("b", "h1", "GPU-0"), cpu, ""},
		{"peer without GPU", node("a", "h1", "GPU-0"), node("b", "h1"), gpu0, ""},
		{"other host", node("a", "h1", "GPU-0"), node("b", "h2", "GPU-0"), gpu0, ""},
		{"peer does not run ipc", node("a", "h1", "GPU-0"), with(node("b", "h1", "GPU-0"), disable(rdma.IPC, "off")), gpu0, ""},
	}
	for _, tc := range tests {
		if got := rdma.DirectSmall(tc.owner, tc.fetch, tc.src); got != tc.want {
			t.Errorf("%s: DirectSmall = %q, want %q", tc.name, got, tc.want)
		}
	}
}
