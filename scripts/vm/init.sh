#!/bin/sh
# /init of the soft-RoCE test VM (see setup.sh). It loads the rxe and 9p
# modules, creates rxe0 and rxe1 on two isolated dummy interfaces (two NICs,
# for the verbs channel's rails; tf.rxe=1 on the kernel command line makes
# rxe0 only), mounts the host's root
# read-only and the results directory writable, and runs the results
# directory's cmd.sh chrooted into the host root. Then it powers off.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

results=""
rxe=2
for a in $(cat /proc/cmdline); do
	case "$a" in
	tf.results=*) results=${a#tf.results=} ;;
	tf.rxe=*) rxe=${a#tf.rxe=} ;;
	esac
done

say() { echo "vm-init: $*"; }
fail() {
	say "FAIL: $*"
	poweroff -f
	sleep 5
}

say "uptime $(cut -d' ' -f1 /proc/uptime) s: loading modules"
for m in $(cat /modules/order); do
	insmod "/modules/$m" || fail "insmod $m"
done

mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host || fail "mount hostroot"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/run
mount -t tmpfs tmp /host/tmp
# The results directory last: when the checkout lives under /tmp or /run,
# its path is inside the tmpfs just mounted, where it is made first.
case "$results" in
/tmp/* | /run/*) mkdir -p "/host$results" || fail "mkdir $results" ;;
esac
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "/host$results" || fail "mount results $results"

chroot /host /bin/sh -c '
	ip link set lo up &&
	{ ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy; } &&
	ip link set dummy0 up &&
	ip addr add 10.99.0.1/24 dev dummy0 &&
	rdma link add rxe0 type rxe netdev dummy0
' || fail "rxe0 setup"
if [ "$rxe" -ge 2 ]; then
	chroot /host /bin/sh -c '
		{ ip link show dummy1 >/dev/null 2>&1 || ip link add dummy1 type dummy; } &&
		ip link set dummy1 up &&
		ip addr add 10.99.1.1/24 dev dummy1 &&
		rdma link add rxe1 type rxe netdev dummy1
	' || fail "rxe1 setup"
fi
say "uptime $(cut -d' ' -f1 /proc/uptime) s: $rxe rxe device(s) up"
cut -d' ' -f1 /proc/uptime >"/host$results/boot_s"

chroot /host /bin/sh -c "ulimit -l unlimited; cd '$results' && TMPDIR=/tmp HOME=/tmp /bin/sh ./cmd.sh >out.log 2>&1; echo \$? >rc"
say "uptime $(cut -d' ' -f1 /proc/uptime) s: tests done, rc $(cat "/host$results/rc" 2>/dev/null)"
sync
umount "/host$results"
poweroff -f
sleep 5
