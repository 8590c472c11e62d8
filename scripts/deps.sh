#!/bin/sh
# deps.sh installs what building tensorferry needs beyond Go: rdma-core's
# headers (the verbs channel compiles against <infiniband/verbs.h> and opens
# libibverbs at run time). CUDA needs nothing at build time: libcuda is
# opened at run time. Idempotent; needs root (or sudo) only when something
# is missing.
set -eu
if [ -f /usr/include/infiniband/verbs.h ] && command -v gcc >/dev/null 2>&1; then
	exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "deps: installing libibverbs-dev and gcc" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libibverbs-dev ibverbs-providers gcc >/dev/null
