#!/bin/sh
# ab.sh runs an interleaved A/B of the control path: two builds of this
# program (remote), "old" and "new", alternated run by run at GOMAXPROCS
# default and 16; within each run the paths' round trips are interleaved
# (--interleave), so a path and its floor are timed over the same stretch.
# It prints the medians, new/old, and each path over raw TCP.
#
#   CGO_ENABLED=0 go build -o /tmp/ab/remote-old ./remote   # on the old commit
#   CGO_ENABLED=0 go build -o /tmp/ab/remote-new ./remote   # on the new one
#   sh remote/ab.sh /tmp/ab          # (binaries may be xz-compressed: remote-old.xz)
#
# Env: RUNS (3 per build and GOMAXPROCS), RTT (20000), ONEWAY (300000),
# PATHS (comma-separated), OUT (raw output; default a temp dir).
set -u
D=$(cd "${1:-$(dirname "$0")}" && pwd)
OUT=${OUT:-$(mktemp -d)}
RUNS=${RUNS:-3}
RTT=${RTT:-20000}
ONEWAY=${ONEWAY:-300000}
BIN=${BIN:-/tmp/tf-ab}
mkdir -p "$BIN" "$OUT"
for b in old new; do
	if [ -x "$D/remote-$b" ]; then cp "$D/remote-$b" "$BIN/remote-$b"
	else xz -dc "$D/remote-$b.xz" > "$BIN/remote-$b"; fi
	chmod +x "$BIN/remote-$b"
done
echo "host: $(nproc) CPUs, $(uname -r); out: $OUT"
PATHS=${PATHS:-raw-tcp,protoactor-grpc,tensorferry,tensorferry-future,tensorferry-poller}
for procs in default 16; do
	for i in $(seq 1 "$RUNS"); do
		for b in old new; do
			f="$OUT/ab-$b-$procs-$i"
			if [ "$procs" = default ]; then
				env -u GOMAXPROCS "$BIN/remote-$b" --json --interleave 10 --paths $PATHS --rtt-count "$RTT" --oneway-count "$ONEWAY" > "$f.jsonl" 2> "$f.log"
			else
				GOMAXPROCS=$procs "$BIN/remote-$b" --json --interleave 10 --paths $PATHS --rtt-count "$RTT" --oneway-count "$ONEWAY" > "$f.jsonl" 2> "$f.log"
			fi
			echo "run $procs $i $b: rc $?" >&2
		done
	done
done
python3 - "$OUT" <<'PY'
import collections, glob, json, os, statistics, sys
d = sys.argv[1]
t = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(d, "ab-*.jsonl"))):
    _, b, procs, i = os.path.basename(f)[:-6].split("-")
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            t[(procs, r["metric"], r["path"], b)].append(r["value"])
med = {k: statistics.median(v) for k, v in t.items()}
paths = ["raw-tcp", "protoactor-grpc", "tensorferry", "tensorferry-future", "tensorferry-poller"]
paths += sorted({k[2] for k in t} - set(paths))
for procs in sorted({k[0] for k in t}, key=lambda p: (p != "default", p)):
    print(f"\nGOMAXPROCS {procs}")
    print(f"{'metric':18} {'path':20} {'old':>10} {'new':>10} {'new/old':>9}  {'old/raw':>8} {'new/raw':>8}  runs old | new")
    for m in ("rtt_p50_us", "rtt_p99_us", "oneway_msgs_per_s"):
        for p in paths:
            a, c = med.get((procs, m, p, "old")), med.get((procs, m, p, "new"))
            if a is None and c is None:
                continue
            ra, rc = med.get((procs, m, "raw-tcp", "old")), med.get((procs, m, "raw-tcp", "new"))
            fmt = lambda v: "-" if v is None else (f"{v:.0f}" if v > 1000 else f"{v:.2f}")
            ratio = lambda x, y: "-" if x is None or not y else f"{x / y:.2f}"
            runs = " ".join(fmt(v) for v in t[(procs, m, p, "old")]) + " | " + " ".join(fmt(v) for v in t[(procs, m, p, "new")])
            print(f"{m:18} {p:20} {fmt(a):>10} {fmt(c):>10} {ratio(c, a):>9}  {ratio(a, ra):>8} {ratio(c, rc):>8}  {runs}")
print("\nRequest ≤ 1.5x raw-tcp rtt; RequestFuture ≤ 2x Request and below protoactor-grpc; one-way tensorferry ≥ 2x protoactor-grpc.")
PY
