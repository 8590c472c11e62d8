#!/bin/sh
# build.sh builds, on this machine, every GPU test and benchmark binary into
# .gpu/ (git-ignored), with the NCCL baseline script beside them, so that
# one command on the GPU machine (scripts/gpu/run.sh) checks everything:
#
#   scripts/gpu/build.sh            # here
#   device run, carry [.gpu]: scripts/gpu/run.sh
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
"$REPO/scripts/deps.sh"
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
OUTDIR=$REPO/.gpu
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/tests" "$OUTDIR/bin" "$OUTDIR/peers"
# Every package whose tests touch CUDA (they skip without a GPU).
for pkg in ./internal/cuda ./memory ./rdma/local ./rdma/staging ./rdma/ipc ./rdma/verbs ./actor ./samples/paramserver/... ./samples/pipeline/...; do
	for p in $("$GO" list "$pkg" 2>/dev/null); do
		name=$(echo "${p#github.com/tensorferry/tensorferry/}" | tr / _)
		# Packages without test files produce no binary.
		"$GO" test -c -o "$OUTDIR/tests/$name.test" "$p"
	done
done
for cmd in ./benchmarks/gpu ./samples/paramserver ./samples/pipeline ./cmd/ferry; do
	[ -d "$cmd" ] && "$GO" build -o "$OUTDIR/bin/$(basename "$cmd")" "$cmd"
done
PEERS=${PEERS:-$REPO/../shared/peers}
[ -f "$PEERS/nccl_sendrecv.py" ] && cp "$PEERS/nccl_sendrecv.py" "$OUTDIR/peers/"
cp "$REPO/scripts/gpu/run.sh" "$OUTDIR/run.sh"
du -sh "$OUTDIR"
ls "$OUTDIR/tests" "$OUTDIR/bin"
