#!/bin/sh
# run.sh runs, on the GPU machine, everything scripts/gpu/build.sh built:
# every GPU test binary (-test.v), the GPU benchmarks, the NCCL baseline in
# the same call, and the samples on GPUs. Results go to $OUT (default
# .gpu/out): tests.log, summary.txt, gpu.jsonl, nccl.jsonl, samples.log.
#
#   scripts/gpu/run.sh [tests|bench|samples|remote|all]   (default all)
#
# remote (not part of all) runs the remote-messaging benchmark on that host
# with GOMAXPROCS=$p for each p in REMOTE_PROCS (default "0 4"; 0 keeps
# Go's default), into remote-<p>.jsonl and the summary.
# GPU_BENCH_MODES picks the benchmark's modes (default all: peer, ipc,
# staging, regcache); TEST_RUN a -test.run pattern for the tests.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
# Unpack the bundle made by build.sh.
G=${GPU_DIR:-/tmp/tensorferry-gpu/g}
if [ -f "$REPO/.gpu/bundle.tar.xz" ]; then
	rm -rf "$(dirname "$G")" && mkdir -p "$(dirname "$G")"
	xz -dc "$REPO/.gpu/bundle.tar.xz" | tar -C "$(dirname "$G")" -xf - || { echo "cannot unpack .gpu/bundle.tar.xz"; exit 1; }
fi
OUT=${OUT:-$REPO/.gpu/out}
mkdir -p "$OUT"
WHAT=${1:-all}
TEST_TIMEOUT=${TEST_TIMEOUT:-240s}
# Never NVLink multicast on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$OUT/summary.txt" 2>&1
nvidia-smi topo -m >> "$OUT/summary.txt" 2>&1
status=0
if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
	: > "$OUT/tests.log"
	for t in "$G"/tests/*.test; do
		name=$(basename "$t" .test)
		echo "=== $name" >> "$OUT/tests.log"
		start=$(date +%s)
		# Tests run in their package directory's stead: testdata is not
		# carried, so tests needing it skip.
		if (cd "$G/tests" && timeout 300 "$t" -test.v -test.timeout "$TEST_TIMEOUT" ${TEST_RUN:+-test.run "$TEST_RUN"}) >> "$OUT/tests.log" 2>&1; then
			res=ok
		else
			res=FAIL; status=1
		fi
		echo "$res $name $(( $(date +%s) - start ))s" >> "$OUT/summary.txt"
	done
	{
		echo "--- test counts (all packages)"
		echo "PASS $(grep -c -- '--- PASS' "$OUT/tests.log")"
		echo "FAIL $(grep -c -- '--- FAIL' "$OUT/tests.log")"
		echo "SKIP $(grep -c -- '--- SKIP' "$OUT/tests.log")"
		grep -- '--- FAIL' "$OUT/tests.log"
	} >> "$OUT/summary.txt"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
	if [ -x "$G/bin/gpu" ]; then
		timeout 400 "$G/bin/gpu" --mode "${GPU_BENCH_MODES:-all}" --out "$OUT" >> "$OUT/summary.txt" 2>&1 || { echo "gpu bench FAILED" >> "$OUT/summary.txt"; status=1; }
	fi
	if [ -f "$G/peers/nccl_sendrecv.py" ]; then
		timeout 300 python3 "$G/peers/nccl_sendrecv.py" --sizes "${NCCL_SIZES:-4K,64K,1M,16M,64M,256M,1G}" > "$OUT/nccl.txt" 2>&1 || echo "nccl baseline FAILED" >> "$OUT/summary.txt"
		grep '^{' "$OUT/nccl.txt" > "$OUT/nccl.jsonl"
		grep -v '^{' "$OUT/nccl.txt" >> "$OUT/summary.txt"
		rm -f "$OUT/nccl.txt"
	fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = samples ]; then
	: > "$OUT/samples.log"
	for s in paramserver pipeline; do
		[ -x "$G/bin/$s" ] || continue
		echo "=== $s" >> "$OUT/samples.log"
		if timeout 200 "$G/bin/$s" >> "$OUT/samples.log" 2>&1; then
			echo "ok sample $s" >> "$OUT/summary.txt"
		else
			echo "FAIL sample $s" >> "$OUT/summary.txt"; status=1
		fi
	done
fi
if [ "$WHAT" = remote ] && [ -x "$G/bin/remote" ]; then
	for p in ${REMOTE_PROCS:-0 4}; do
		echo "--- remote-messaging benchmark, GOMAXPROCS=$p (0: default, $(nproc) CPUs)" >> "$OUT/summary.txt"
		if [ "$p" = 0 ]; then
			timeout 300 "$G/bin/remote" ${REMOTE_ARGS:---rtt-count 10000 --oneway-count 300000} --json > "$OUT/remote-$p.jsonl" 2>> "$OUT/summary.txt" || status=1
		else
			GOMAXPROCS=$p timeout 300 "$G/bin/remote" ${REMOTE_ARGS:---rtt-count 10000 --oneway-count 300000} --json > "$OUT/remote-$p.jsonl" 2>> "$OUT/summary.txt" || status=1
		fi
		cat "$OUT/remote-$p.jsonl" >> "$OUT/summary.txt"
	done
fi
cat "$OUT/summary.txt"
exit $status
