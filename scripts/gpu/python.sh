#!/bin/sh
# python.sh checks issue 33 on the GPU machine: a Go node and a PyTorch
# process exchanging CUDA tensors over ipc (python's Go tests and the
# Python package's unit tests), the torchps sample on GPUs, and the
# Go <-> Python benchmark beside Go <-> Go.
#
#   scripts/gpu/python.sh build        # here (needs Go): .gpu/python.tar.xz
#   device run, carry [.gpu]: scripts/gpu/python.sh [tests|sample|bench|all|stages]   (default all)
#
# build adds its bundle (about 11 MiB) beside scripts/gpu/build.sh's (it removes nothing
# else under .gpu/). Results go to $OUT (default .gpu/out): python.txt (the
# summary), python-tests.log, torchps.log, pytorch.jsonl and pytorch.csv.
# TF_PYTHON picks the interpreter with torch (default: python3 in PATH);
# BENCH_ARGS adds arguments to the benchmark (e.g. "--max 256MiB").
# stages (not in all) runs the benchmark at 4-64 KiB with the Python
# peer's stage timers on (peer.py's TF_BENCH_STAGES): stages.txt.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
WHAT=${1:-all}
if [ "$WHAT" = build ]; then
	set -e
	GO=${GO:-go}
	command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
	STAGE=$(mktemp -d)
	trap 'rm -rf "$STAGE"' EXIT
	mkdir -p "$STAGE/p"
	FLAGS="-trimpath -ldflags=-s -ldflags=-w"
	"$GO" test -c $FLAGS -o "$STAGE/p/python.test" ./python
	"$GO" test -c $FLAGS -o "$STAGE/p/torchps.test" ./samples/torchps
	"$GO" build $FLAGS -o "$STAGE/p/torchps" ./samples/torchps
	(cd benchmarks && "$GO" build $FLAGS -o "$STAGE/p/pytorch" ./pytorch)
	mkdir -p "$REPO/.gpu"
	tar -C "$STAGE" -cf - p | xz -T2 -9 > "$REPO/.gpu/python.tar.xz"
	du -sh "$REPO/.gpu/python.tar.xz"
	echo "on the GPU machine (carry .gpu): scripts/gpu/python.sh"
	exit 0
fi
P=${PY_GPU_DIR:-/tmp/tensorferry-py/p}
if [ -f "$REPO/.gpu/python.tar.xz" ]; then
	rm -rf "$(dirname "$P")" && mkdir -p "$(dirname "$P")"
	xz -dc "$REPO/.gpu/python.tar.xz" | tar -C "$(dirname "$P")" -xf - || { echo "cannot unpack .gpu/python.tar.xz"; exit 1; }
fi
[ -x "$P/python.test" ] || { echo "no binaries: run scripts/gpu/python.sh build here first, then carry .gpu"; exit 1; }
OUT=${OUT:-$REPO/.gpu/out}
mkdir -p "$OUT"
PY=${TF_PYTHON:-$(command -v python3)}
export TF_PYTHON="$PY" PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="$OUT/python.txt"
{
	nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
	echo "python: $PY"
	"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
} > "$S" 2>&1
status=0
if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
	L="$OUT/python-tests.log"
	: > "$L"
	# The Go tests run in python/ (they start tests/peer.py), the sample's
	# from the repository root (samples/torchps/worker.py).
	if (cd python && timeout 240 "$P/python.test" -test.v -test.timeout 230s) >> "$L" 2>&1; then
		echo "ok python (Go tests)" >> "$S"
	else
		echo "FAIL python (Go tests)" >> "$S"; status=1
	fi
	if (cd python && timeout 150 "$PY" -m unittest discover -s tests -t . -p 'test_*.py') >> "$L" 2>&1; then
		echo "ok python (unit tests)" >> "$S"
	else
		echo "FAIL python (unit tests)" >> "$S"; status=1
	fi
	if timeout 180 "$P/torchps.test" -test.v -test.timeout 170s >> "$L" 2>&1; then
		echo "ok samples/torchps (tests)" >> "$S"
	else
		echo "FAIL samples/torchps (tests)" >> "$S"; status=1
	fi
	grep -E -- '--- (PASS|FAIL|SKIP)|^\s+\S+_test.go:[0-9]+: ' "$L" >> "$S"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sample ]; then
	if timeout 300 "$P/torchps" -gpu on -python "$PY" -worker samples/torchps/worker.py > "$OUT/torchps.log" 2>&1; then
		echo "ok sample torchps on GPUs" >> "$S"
	else
		echo "FAIL sample torchps on GPUs" >> "$S"; status=1
	fi
	grep -E "step (0|29) |final|converged|torchps:" "$OUT/torchps.log" | head -20 >> "$S"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
	if ! timeout 500 "$P/pytorch" --python "$PY" --peer benchmarks/pytorch/peer.py --out "$OUT" ${BENCH_ARGS:-} >> "$S" 2>&1; then
		echo "FAIL benchmark pytorch" >> "$S"; status=1
	fi
fi
if [ "$WHAT" = stages ]; then
	rm -f "$OUT/stages.txt"
	if ! TF_BENCH_STAGES="$OUT/stages.txt" timeout 200 "$P/pytorch" --python "$PY" --peer benchmarks/pytorch/peer.py \
		--min 4KiB --max 64KiB --reps 300 ${BENCH_ARGS:-} >> "$S" 2>&1; then
		echo "FAIL benchmark pytorch with stage timers" >> "$S"; status=1
	fi
	cat "$OUT/stages.txt" >> "$S" 2>/dev/null
fi
cat "$S"
exit $status
