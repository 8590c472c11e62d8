#!/bin/sh
# run-tests.sh boots the soft-RoCE VM (QEMU, TCG) and runs test binaries built
# on this machine inside it, chrooted into this machine's root (shared
# read-only over 9p) so they use the host's rdma-core with the rxe provider.
# The guest has no NIC: rxe0 and rxe1 sit on isolated dummy interfaces.
#
# Usage: scripts/vm/run-tests.sh BINARY [ARGS...] [:: BINARY [ARGS...]]...
#   e.g. go test -c -o /tmp/ibverbs.test ./internal/ibverbs &&
#        scripts/vm/run-tests.sh /tmp/ibverbs.test -test.v
#
# Each binary runs in turn (a failing one does not stop the next) with its
# working directory in a scratch results directory. The last line printed is
# "VM-VERBS: PASS" or "VM-VERBS: FAIL (reason)"; the exit status is 0 on
# PASS.
#
# Environment:
#   VM_DIR      kernel and initramfs made by setup.sh (default: <repo>/.vm)
#   VM_TIMEOUT  hard limit on QEMU in seconds (default 300)
#   VM_KEEP     keep the results directory when set to 1
#   VM_RXE      soft-RoCE devices in the guest, 1 or 2 (default 2)
set -eu

REPO=$(cd "$(dirname "$0")/../.." && pwd)
VM_DIR=${VM_DIR:-$REPO/.vm}
VM_TIMEOUT=${VM_TIMEOUT:-300}

result() { # result PASS|"FAIL (why)" - print the verdict and exit
	echo "VM-VERBS: $1"
	case "$1" in PASS) exit 0 ;; *) exit 1 ;; esac
}

if [ $# -eq 0 ]; then
	echo "usage: $0 BINARY [ARGS...] [:: BINARY [ARGS...]]..." >&2
	result "FAIL (no test binary given)"
fi

"$REPO/scripts/vm/setup.sh" || result "FAIL (setup.sh failed)"

mkdir -p "$VM_DIR/runs"
RES=$(mktemp -d "$VM_DIR/runs/run.XXXXXX")
RES=$(cd "$RES" && pwd -P)
cleanup() { [ "${VM_KEEP:-0}" = 1 ] || rm -rf "$RES"; }
trap cleanup EXIT

first=1
for a in "$@"; do
	if [ "$a" = "::" ]; then first=1; continue; fi
	if [ $first = 1 ]; then
		[ -f "$a" ] || result "FAIL (no such binary: $a)"
		first=0
	fi
done

# Copy the binaries into the results directory (the guest mounts tmpfs over
# /tmp, so paths there would vanish) and write the guest's command script.
n=0
{
	echo "#!/bin/sh"
	echo "status=0"
	line=""
	flush() {
		[ -n "$line" ] || return 0
		echo "echo \"=== RUN $binname\""
		echo "$line || { echo \"=== $binname exit \$?\"; status=1; }"
	}
	binname=""
	first=1
	for a in "$@"; do
		if [ "$a" = "::" ]; then
			flush
			line=""
			first=1
			continue
		fi
		if [ $first = 1 ]; then
			n=$((n + 1))
			binname="bin$n-$(basename "$a")"
			cp "$a" "$RES/$binname"
			chmod 755 "$RES/$binname"
			line="./$binname"
			first=0
		else
			q=$(printf "%s" "$a" | sed "s/'/'\\\\''/g")
			line="$line '$q'"
		fi
	done
	flush
	echo 'exit $status'
} >"$RES/cmd.sh" || result "FAIL (bad arguments)"

LOG="$RES/console.log"
start=$(date +%s)
set +e
timeout -k 10 "$VM_TIMEOUT" qemu-system-x86_64 \
	-machine q35,accel=tcg -cpu max -m 2048 -smp 2 \
	-nographic -no-reboot -nic none \
	-kernel "$VM_DIR/kernel/vmlinuz" -initrd "$VM_DIR/initramfs.cpio.gz" \
	-append "console=ttyS0 quiet loglevel=4 panic=-1 tf.results=$RES tf.rxe=${VM_RXE:-2}" \
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
	-virtfs "local,path=$RES,mount_tag=results,security_model=none" \
	</dev/null >"$LOG" 2>&1
qrc=$?
set -e
end=$(date +%s)

cp "$LOG" "$VM_DIR/last-console.log" 2>/dev/null || true
[ -f "$RES/out.log" ] && cp "$RES/out.log" "$VM_DIR/last-out.log"

if [ -f "$RES/out.log" ]; then
	cat "$RES/out.log"
fi
echo "vm: qemu exit $qrc after $((end - start)) s; boot to rxe0 $(cat "$RES/boot_s" 2>/dev/null || echo '?') s (guest uptime)"

why=""
if [ $qrc -eq 124 ] || [ $qrc -eq 137 ]; then
	why="QEMU timed out after $VM_TIMEOUT s"
elif [ ! -f "$RES/boot_s" ]; then
	why="guest did not bring up rxe0"
elif [ ! -f "$RES/rc" ]; then
	why="tests did not finish"
elif [ "$(cat "$RES/rc")" != 0 ]; then
	why="tests failed, exit $(cat "$RES/rc")"
fi
if [ -n "$why" ]; then
	echo "--- guest console (tail) ---"
	tail -n 40 "$LOG"
	result "FAIL ($why)"
fi
result PASS
