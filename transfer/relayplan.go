package transfer

// RelayMember is a holder-to-be of one export's content in a relay plan:
// the owner or a receiving node, where it is.
type RelayMember struct {
	Node string // node name
	Host string // host identity: members of one host reach each other without the network
	GPU  int    // device ordinal of its copy; -1 for host memory
}

// RelayOwner is the parent PlanRelay gives a receiver that fetches from
// the owner itself.
const RelayOwner = -1

// PlanRelay plans how receivers get one export's content from owner: it
// returns, for each receiver, the index in receivers of its parent, the
// holder it fetches from (RelayOwner: the owner). The plan is a tree
// rooted at the owner, with the link each byte crosses as cheap as the
// members allow:
//
//   - across hosts, one receiver per host (its first) fetches; the others
//     of that host fetch from holders on it. Host heads form a tree under
//     the owner.
//   - within a host, one receiver per GPU (its first) crosses between
//     GPUs, in a chain from the host's root (the owner on its host, the
//     host head on the others): each GPU's link out carries the content
//     once, and a streamed relay pipelines the chain (4×H200: three GPUs
//     fed from the owner's link took 8.5 ms at 1 GiB, a chain 4.1 ms);
//     the others copy on their GPU, in a tree under their GPU's head, or
//     under the root on the root's GPU.
//
// The trees across hosts and on a GPU have at most fanout children per
// holder (fanout < 1 counts as 1: a chain, which pipelines best when a
// link's bandwidth is the limit), so a holder has at most fanout children
// across hosts, one across GPUs and fanout on its GPU. The plan depends
// only on its inputs and their order.
func PlanRelay(owner RelayMember, receivers []RelayMember, fanout int) []int {
	fanout = max(fanout, 1)
	parent := make([]int, len(receivers))
	// Receivers by host, hosts in order of first appearance.
	var hosts []string
	byHost := map[string][]int{}
	for i, r := range receivers {
		if _, ok := byHost[r.Host]; !ok {
			hosts = append(hosts, r.Host)
		}
		byHost[r.Host] = append(byHost[r.Host], i)
	}
	var heads []int
	for _, h := range hosts {
		m := byHost[h]
		if h == owner.Host {
			planHost(receivers, parent, RelayOwner, owner.GPU, m, fanout)
			continue
		}
		heads = append(heads, m[0])
		planHost(receivers, parent, m[0], receivers[m[0]].GPU, m[1:], fanout)
	}
	kary(parent, RelayOwner, heads, fanout)
	return parent
}

// planHost plans the members of one host under root, a holder on rootGPU:
// a chain of the other GPUs' heads from root, a tree of the members on
// rootGPU under root, and under each other GPU's head a tree of its GPU's
// other members.
func planHost(receivers []RelayMember, parent []int, root, rootGPU int, members []int, fanout int) {
	var gpus []int
	byGPU := map[int][]int{}
	for _, i := range members {
		g := receivers[i].GPU
		if _, ok := byGPU[g]; !ok {
			gpus = append(gpus, g)
		}
		byGPU[g] = append(byGPU[g], i)
	}
	var heads []int
	for _, g := range gpus {
		m := byGPU[g]
		if g == rootGPU {
			kary(parent, root, m, fanout)
			continue
		}
		heads = append(heads, m[0])
		kary(parent, m[0], m[1:], fanout)
	}
	kary(parent, root, heads, 1)
}

// kary lays nodes out as a tree of at most k children per holder under
// root, in order: a k-ary heap, in which nodes[j]'s parent is root for the
// first k and nodes[(j-k)/k] past them.
func kary(parent []int, root int, nodes []int, k int) {
	for j, n := range nodes {
		if j < k {
			parent[n] = root
		} else {
			parent[n] = nodes[(j-k)/k]
		}
	}
}
