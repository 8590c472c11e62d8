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
# The binaries are stripped and packed into one xz bundle: the device tool
# carries at most 64 MiB.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
OUTDIR=$STAGE/g
mkdir -p "$OUTDIR/tests" "$OUTDIR/bin" "$OUTDIR/peers"
FLAGS="-trimpath -ldflags=-s -ldflags=-w"
# Every package whose tests touch CUDA (they skip without a GPU).
for pkg in ./internal/cuda ./memory ./tensor ./benchmarks/gpu ./transfer ./rdma/local ./rdma/staging ./rdma/ipc ./rdma/verbs ./actor ./samples/paramserver/... ./samples/pipeline/...; do
	for p in $("$GO" list "$pkg" 2>/dev/null); do
		name=$(echo "${p#github.com/tensorferry/tensorferry/}" | tr / _)
		# Packages without test files produce no binary.
		"$GO" test -c $FLAGS -o "$OUTDIR/tests/$name.test" "$p"
	done
done
for cmd in ./benchmarks/gpu ./benchmarks/remote ./samples/paramserver ./samples/pipeline ./cmd/ferry; do
	[ -d "$cmd" ] && "$GO" build $FLAGS -o "$OUTDIR/bin/$(basename "$cmd")" "$cmd"
done
PEERS=${PEERS:-$REPO/../shared/peers}
for f in nccl_sendrecv.py nccl_collectives.py; do
	[ -f "$PEERS/$f" ] && cp "$PEERS/$f" "$OUTDIR/peers/"
done
cp "$REPO/scripts/gpu/run.sh" "$OUTDIR/run.sh"
rm -rf "$REPO/.gpu"
mkdir -p "$REPO/.gpu"
# -9: its 64 MiB dictionary spans several binaries, which share most of
# their code (about 29 MiB instead of 71 MiB at -4).
tar -C "$STAGE" -cf - g | xz -T2 -9 > "$REPO/.gpu/bundle.tar.xz"
ls "$OUTDIR/tests" "$OUTDIR/bin"
du -sh "$OUTDIR" "$REPO/.gpu/bundle.tar.xz"
echo "on the GPU machine (carry .gpu): scripts/gpu/run.sh"
