#!/bin/sh
# tracecost.sh: what tracing costs when no tracer provider is configured.
# Builds benchmarks/remote twice - as usual (tracing compiled in, off: no
# provider) and with -tags notrace (the hooks compiled out) - and runs the
# two binaries alternately (the first of each round alternating), ROUNDS
# times each, printing their JSON lines
# tagged "tree":"off" or "tree":"notrace" and "run":N, then the median of
# each figure per tree on stderr.
#
#   scripts/tracecost.sh [ROUNDS] [remote flags...] > results.jsonl
#   (default: 6 rounds, --rtt-count 10000 --oneway-count 300000 --paths raw-tcp,tensorferry)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-6}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- --rtt-count 10000 --oneway-count 300000 --paths raw-tcp,tensorferry
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/off" ./benchmarks/remote
go build -tags notrace -o "$dir/notrace" ./benchmarks/remote
i=1
while [ "$i" -le "$rounds" ]; do
	# Odd rounds run off first, even rounds notrace first: neither build
	# always follows the other.
	order="off notrace"
	[ $((i % 2)) -eq 0 ] && order="notrace off"
	for tree in $order; do
		"$dir/$tree" --json "$@" 2>/dev/null | sed "s/^{/{\"tree\":\"$tree\",\"run\":$i,/" | tee -a "$dir/all.jsonl"
	done
	i=$((i + 1))
done
# Medians per tree, path and metric.
sed 's/.*"tree":"\([^"]*\)".*"path":"\([^"]*\)".*"metric":"\([^"]*\)".*"value":\([^,}]*\).*/\1 \2 \3 \4/' "$dir/all.jsonl" |
	sort -k2,2 -k3,3 -k1,1 -k4,4g |
	awk '{k=$2" "$3" "$1; v[k]=v[k]" "$4; n[k]++}
	     END {for (k in v) {split(substr(v[k],2), a, " "); m=a[int((n[k]+1)/2)]; if (n[k]%2==0) m=(a[n[k]/2]+a[n[k]/2+1])/2; printf "%-40s median %s  (runs:%s)\n", k, m, v[k]}}' |
	sort >&2
