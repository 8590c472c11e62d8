#!/bin/sh
# deps.sh installs what building and checking tensorferry needs beyond Go:
# rdma-core's headers (the verbs channel compiles against
# <infiniband/verbs.h> and opens libibverbs at run time), Prometheus (for
# the metrics test), etcd (for the discovery tests), and the pinned
# static checkers scripts/test runs (staticcheck, deadcode), built with
# `go install` into $TF_TOOLS (default ~/.cache/tensorferry/tools). CUDA
# needs nothing at build time: libcuda is opened at run time. Idempotent;
# needs root (or sudo) only when a system package is missing.
set -eu
if ! { [ -f /usr/include/infiniband/verbs.h ] && command -v gcc >/dev/null 2>&1; }; then
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "deps: installing libibverbs-dev and gcc" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libibverbs-dev ibverbs-providers gcc >/dev/null
fi
# Prometheus: the metrics test (samples/paramserver) scrapes a cluster with
# a real server; it skips, saying why, where the binary is missing.
if ! command -v prometheus >/dev/null 2>&1; then
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "deps: installing prometheus" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# etcd: the discovery tests register nodes in a real etcd server on
# loopback; they skip, saying why, where the binary is missing.
if ! command -v etcd >/dev/null 2>&1; then
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "deps: installing etcd-server" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
# Python: the Python package's tests and the Go test that runs a Python
# node use Debian's python3 with torch (CPU), msgpack and hypothesis; they
# skip, saying why, where those are missing.
if ! /usr/bin/python3 -c 'import torch, msgpack, hypothesis' >/dev/null 2>&1; then
	SUDO=
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	echo "deps: installing python3-torch python3-msgpack python3-hypothesis" >&2
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch python3-msgpack python3-hypothesis >/dev/null
fi

GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
TF_TOOLS=${TF_TOOLS:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tensorferry/tools}
mkdir -p "$TF_TOOLS"
# tool installs bin from package pkg of module mod at version ver, unless
# the binary there was already built from that version. Both versions
# support Go 1.26.
tool() { # bin pkg mod ver
	if [ -x "$TF_TOOLS/$1" ] && "$GO" version -m "$TF_TOOLS/$1" 2>/dev/null | grep -q "^[[:space:]]*mod[[:space:]]*$3[[:space:]]*$4[[:space:]]"; then
		return 0
	fi
	echo "deps: installing $2@$4 into $TF_TOOLS" >&2
	(cd / && GOWORK=off GOFLAGS= GOBIN="$TF_TOOLS" "$GO" install "$2@$4")
}
tool staticcheck honnef.co/go/tools/cmd/staticcheck honnef.co/go/tools v0.8.2 # staticcheck 2026.2.2
tool deadcode golang.org/x/tools/cmd/deadcode golang.org/x/tools v0.52.0
