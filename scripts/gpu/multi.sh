#!/bin/sh
# multi.sh runs, on a GPU machine of several GPUs, what one process per GPU
# shows (issue 17's four- and eight-GPU checks), with the binaries
# scripts/gpu/build.sh bundled:
#
#   1. a cluster config of one node per GPU on loopback (nodeI on cuda:I),
#      and `ferry topo` on it: the data channel and control transport of
#      every pair, beside `nvidia-smi topo -m` (the NVLink/NVSwitch layout);
#   2. the all-pairs matrix: for each pair of GPUs, cuMemcpyPeer (gpu --mode
#      peer) and the ipc stream (gpu --mode ipc, one process per GPU) at
#      MATRIX_SIZE (default 256MiB), as matrix.jsonl and a table;
#   3. the parameter server with one process per GPU: the first ceil(N/3)
#      nodes hold one shard each, the others run one worker each (on their
#      GPU: gradients and weights move between GPUs);
#   4. collectives (not part of all): our modes beside NCCL's in the same
#      call: gpu --mode psexchange (one shard + one worker per GPU, P =
#      PS_SIZES, default 256MiB,1GiB) beside nccl_collectives.py's
#      allreduce and allgather of P on the same N GPUs; with 2 GPUs or
#      more, gpu --mode reuse (cuda:0 -> cuda:1, 4 MiB..1 GiB) beside
#      nccl_sendrecv.py.
#
#   scripts/gpu/multi.sh [topo|matrix|paramserver|collectives|all]   (default all)
#
# Results go to $OUT (default .gpu/out): multi.txt (the summary), topo.txt,
# matrix.jsonl, paramserver.log, cluster.yaml, collectives/ (each tool's
# JSON lines and logs).
#
# MULTI_GPUS=N takes N GPUs (default: all that nvidia-smi lists);
# MULTI_DEVICE=D puts every node on device D instead (cpu, or cuda:0 for N
# processes sharing one GPU) and skips the matrix unless MATRIX_PAIRS is
# given: the script's own tests, MULTI_GPUS=3 MULTI_DEVICE=cpu on a
# machine without GPUs, MULTI_GPUS=3 MULTI_DEVICE=cuda:0 MATRIX_PAIRS=0-0
# on one GPU. MATRIX_PAIRS="0-1 2-3" limits the matrix to those pairs;
# MATRIX_BOTH=1 times both directions of each pair.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
G=${GPU_DIR:-/tmp/tensorferry-gpu/g}
if [ -f "$REPO/.gpu/bundle.tar.xz" ] && [ ! -x "$G/bin/ferry" ]; then
	mkdir -p "$(dirname "$G")"
	xz -dc "$REPO/.gpu/bundle.tar.xz" | tar -C "$(dirname "$G")" -xf - || { echo "cannot unpack .gpu/bundle.tar.xz"; exit 1; }
fi
for b in ferry paramserver gpu; do
	[ -x "$G/bin/$b" ] || { echo "multi.sh: $G/bin/$b missing (run scripts/gpu/build.sh, or set GPU_DIR)"; exit 1; }
done
OUT=${OUT:-$REPO/.gpu/out}
mkdir -p "$OUT"
WHAT=${1:-all}
export NCCL_NVLS_ENABLE=0
DEVICE=${MULTI_DEVICE:-cuda}
if [ -n "${MULTI_GPUS:-}" ]; then
	N=$MULTI_GPUS
else
	N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ "$N" -lt 1 ]; then
	echo "multi.sh: no GPU listed by nvidia-smi (MULTI_GPUS=N MULTI_DEVICE=cpu runs the script on the CPU)"
	exit 1
fi
SUM="$OUT/multi.txt"
: > "$SUM"
status=0
say() { echo "$*" | tee -a "$SUM"; }
say "multi.sh: $N nodes on $([ "$DEVICE" = cuda ] && echo "one GPU each" || echo "$DEVICE"), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
nvidia-smi topo -m >> "$SUM" 2>&1 || true

# The cluster: nodeI on 127.0.0.1, control port BASE+I (data +100, gossip
# +200), metrics BASE+300+I, device cuda:I (or cpu).
BASE=${MULTI_BASE_PORT:-17000}
CFG="$OUT/cluster.yaml"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/secret.key"
chmod 600 "$OUT/secret.key"
{
	echo "cluster: multi"
	echo "secret_file: secret.key"
	echo "nodes:"
	i=0
	while [ $i -lt "$N" ]; do
		dev="cuda:$i"
		[ "$DEVICE" = cuda ] || dev=$DEVICE
		echo "  - name: node$i"
		echo "    address: 127.0.0.1:$((BASE + i))"
		echo "    devices: [$dev]"
		echo "    metrics_address: 127.0.0.1:$((BASE + 300 + i))"
		i=$((i + 1))
	done
} > "$CFG"

if [ "$WHAT" = all ] || [ "$WHAT" = topo ]; then
	say "--- ferry topo"
	if "$G/bin/ferry" topo --config "$CFG" > "$OUT/topo.txt" 2>&1; then
		cat "$OUT/topo.txt" >> "$SUM"
	else
		say "ferry topo FAILED:"; cat "$OUT/topo.txt" >> "$SUM"; status=1
	fi
fi

if { [ "$WHAT" = all ] || [ "$WHAT" = matrix ]; } && [ "$DEVICE" != cuda ] && [ -z "${MATRIX_PAIRS:-}" ]; then
	say "--- matrix skipped: MULTI_DEVICE=$DEVICE"
elif [ "$WHAT" = all ] || [ "$WHAT" = matrix ]; then
	say "--- all-pairs matrix at ${MATRIX_SIZE:-256MiB}: cuMemcpyPeer and the ipc stream"
	pairs=${MATRIX_PAIRS:-}
	if [ -z "$pairs" ]; then
		i=0
		while [ $i -lt "$N" ]; do
			j=$((i + 1))
			while [ $j -lt "$N" ]; do
				pairs="$pairs $i-$j"
				[ -n "${MATRIX_BOTH:-}" ] && pairs="$pairs $j-$i"
				j=$((j + 1))
			done
			i=$((i + 1))
		done
	fi
	: > "$OUT/matrix.jsonl"
	for p in $pairs; do
		s=${p%-*}
		d=${p#*-}
		for mode in peer ipc; do
			dir="$OUT/matrix/$s-$d-$mode"
			mkdir -p "$dir"
			if timeout 300 "$G/bin/gpu" --mode $mode --src "$s" --dst "$d" --min "${MATRIX_SIZE:-256MiB}" --max "${MATRIX_SIZE:-256MiB}" --out "$dir" > "$dir/log.txt" 2>&1; then
				if [ -s "$dir/gpu.jsonl" ]; then
					sed "s/^{/{\"src\":$s,\"dst\":$d,/" "$dir/gpu.jsonl" >> "$OUT/matrix.jsonl"
				else
					say "gpu --mode $mode --src $s --dst $d: no figures (see matrix/$s-$d-$mode/log.txt)"
				fi
			else
				say "gpu --mode $mode --src $s --dst $d FAILED:"; tail -5 "$dir/log.txt" >> "$SUM"; status=1
			fi
		done
	done
	python3 - "$OUT/matrix.jsonl" <<'EOF' | tee -a "$SUM"
import json, sys
peer, ipc = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("metric") != "gbps":
        continue
    key = (r["src"], r["dst"])
    if r["path"] == "cuMemcpyPeer":
        peer[key] = r["value"]
    elif r["path"] == "tensorferry-ipc-stream":
        ipc[key] = r["value"]
def cell(v):
    return "-" if v is None else f"{v:.1f}"
keys = sorted(set(peer) | set(ipc))
if not keys:
    print("no pair timed (one GPU: MATRIX_PAIRS=0-0 times the ipc stream alone)")
else:
    print(f"{'pair':>6} {'cuMemcpyPeer GB/s':>18} {'ipc stream GB/s':>16} {'ipc/peer':>9}")
for key in keys:
    p, s = peer.get(key), ipc.get(key)
    ratio = f"{s / p:.1%}" if p and s else "-"
    print(f"{key[0]:>3}-{key[1]:<2} {cell(p):>18} {cell(s):>16} {ratio:>9}")
EOF
fi

if [ "$WHAT" = all ] || [ "$WHAT" = paramserver ]; then
	shards=$(((N + 2) / 3))
	workers=$((N - shards))
	[ "$workers" -lt 1 ] && workers=1
	if [ "$N" = 1 ]; then
		say "--- parameter server on one node: 1 shard, 1 worker"
	else
		say "--- parameter server, one process per node: $shards shard(s) on node0..node$((shards - 1)), $workers worker(s) on node$shards..node$((N - 1))"
	fi
	: > "$OUT/paramserver.log"
	pids=""
	i=0
	while [ $i -lt "$N" ]; do
		"$G/bin/paramserver" --config "$CFG" --node "node$i" --shards "$shards" --workers "$workers" ${PS_ARGS:-} --timeout 5m > "$OUT/paramserver-node$i.log" 2>&1 &
		pids="$pids $!"
		i=$((i + 1))
	done
	i=0
	for pid in $pids; do
		if wait "$pid"; then
			echo "node$i: ok" >> "$OUT/paramserver.log"
		else
			echo "node$i: exit status $?" >> "$OUT/paramserver.log"; status=1
		fi
		echo "=== node$i" >> "$OUT/paramserver.log"
		cat "$OUT/paramserver-node$i.log" >> "$OUT/paramserver.log"
		rm -f "$OUT/paramserver-node$i.log"
		i=$((i + 1))
	done
	grep -E '^node[0-9]+: |final loss|distance|step time|channel |done:' "$OUT/paramserver.log" | tee -a "$SUM"
fi
if [ "$WHAT" = collectives ]; then
	C="$OUT/collectives"
	mkdir -p "$C"
	PS_SIZES=${PS_SIZES:-256MiB,1GiB}
	# nccl_collectives.py's sizes: 256MiB -> 256M.
	NSIZES=$(echo "$PS_SIZES" | sed 's/iB//g')
	say "--- collectives on $N GPUs: psexchange at P = $PS_SIZES beside NCCL allreduce/allgather; reuse beside NCCL send/recv"
	if [ -f "$G/peers/nccl_collectives.py" ]; then
		timeout 600 python3 "$G/peers/nccl_collectives.py" --gpus "$N" --sizes "$NSIZES" --ops allreduce,allgather,broadcast \
			> "$C/nccl_collectives.jsonl" 2> "$C/nccl_collectives.log" || { say "nccl_collectives.py FAILED:"; tail -5 "$C/nccl_collectives.log" >> "$SUM"; status=1; }
	else
		say "nccl_collectives.py missing from the bundle (scripts/gpu/build.sh copies it from ../shared/peers)"
	fi
	if ! timeout 600 "$G/bin/gpu" --mode psexchange --gpus "$N" --ps-sizes "$PS_SIZES" --json > "$C/psexchange.jsonl" 2> "$C/psexchange.log"; then
		say "gpu --mode psexchange FAILED:"; tail -5 "$C/psexchange.log" >> "$SUM"; status=1
	fi
	if [ "$N" -ge 2 ]; then
		if [ -f "$G/peers/nccl_sendrecv.py" ]; then
			timeout 300 python3 "$G/peers/nccl_sendrecv.py" --sizes 4M,16M,64M,256M,1G > "$C/nccl_sendrecv.txt" 2>&1 || { say "nccl_sendrecv.py FAILED"; status=1; }
		fi
		if ! timeout 600 "$G/bin/gpu" --mode reuse --src 0 --dst 1 --min 4MiB --max 1GiB --json > "$C/reuse.jsonl" 2> "$C/reuse.log"; then
			say "gpu --mode reuse FAILED:"; tail -5 "$C/reuse.log" >> "$SUM"; status=1
		fi
	fi
	python3 - "$C" <<'EOF' | tee -a "$SUM"
import json, os, sys
d = sys.argv[1]
def rows(name):
    out = []
    try:
        for line in open(os.path.join(d, name)):
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    except OSError:
        pass
    return out
def fmt(v):
    return f"{v:.1f}" if v else "-"
nccl = {(r["peer"], r["bytes"]): r["us"] for r in rows("nccl_collectives.jsonl")}
ps = [r for r in rows("psexchange.jsonl") if r.get("metric") == "us"]
if ps:
    print(f"{'P':>10} {'psexchange us':>14} {'allreduce us':>13} {'ratio':>6} {'allgather us':>13} {'channel':>8}")
for r in ps:
    ar, ag = nccl.get(("nccl-allreduce", r["size"])), nccl.get(("nccl-allgather", r["size"]))
    ratio = f"{r['value'] / ar:.2f}" if ar else "-"
    print(f"{r['size']:>10} {fmt(r['value']):>14} {fmt(ar):>13} {ratio:>6} {fmt(ag):>13} {r.get('channel', ''):>8}")
sr = {r["bytes"]: r["us"] for r in rows("nccl_sendrecv.txt") if r.get("peer") == "nccl-sendrecv"}
reuse = {}
for r in rows("reuse.jsonl"):
    if r.get("metric") == "us":
        reuse.setdefault(r["size"], {})[r["path"]] = (r["value"], r.get("channel", ""))
if reuse:
    print(f"{'bytes':>10} {'reuse us':>9} {'alloc us':>9} {'stream us':>10} {'nccl send/recv us':>18} {'stream/nccl':>11} {'channel':>8}")
for n in sorted(reuse):
    ru, ch = reuse[n].get("tensorferry-reuse", (None, ""))
    al, _ = reuse[n].get("tensorferry-alloc", (None, ""))
    st, _ = reuse[n].get("tensorferry-reuse-stream", (None, ""))
    s = sr.get(n)
    ratio = f"{st / s:.2f}" if st and s else "-"
    print(f"{n:>10} {fmt(ru):>9} {fmt(al):>9} {fmt(st):>10} {fmt(s):>18} {ratio:>11} {ch:>8}")
EOF
fi
rm -f "$OUT/secret.key"
say "multi.sh: exit status $status"
exit $status
