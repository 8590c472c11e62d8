#!/bin/sh
# setup.sh prepares the soft-RoCE test VM: it installs the host packages
# (QEMU, busybox, rdma-core), downloads a Debian 6.12 kernel package (Debian
# 12 carries linux-image-6.12.*+deb12-amd64 in bookworm-security and
# bookworm-backports; the latter is added to the apt sources when no suite
# lists one) and unpacks it (never installs it) into .vm/, and builds a
# busybox initramfs that loads the rxe and 9p modules. It is idempotent: a
# second run only checks.
#
# 6.12 rather than bookworm's own 6.1: rxe gained type-2 memory window fixes
# after 6.1; the verbs tests report whether window bounds are enforced.
#
# Usage: scripts/vm/setup.sh        (as root, on Debian 12)
#
# Environment:
#   VM_DIR      where the kernel and initramfs go (default: <repo>/.vm)
#   VM_SERIES   kernel series (default 6.12; 6.1 picks bookworm's linux-image-6.1.0-*-amd64)
#   VM_KERNEL   Debian kernel package to use (default: newest of VM_SERIES)
set -eu

REPO=$(cd "$(dirname "$0")/../.." && pwd)
VM_DIR=${VM_DIR:-$REPO/.vm}
VM_SERIES=${VM_SERIES:-6.12}
PKGS="qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils libibverbs-dev iproute2 xz-utils zstd cpio kmod"

log() { echo "vm-setup: $*" >&2; }

need_pkgs() {
	for p in $PKGS; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
	done
	return 1
}

if need_pkgs; then
	if [ "$(id -u)" -ne 0 ]; then
		log "packages missing ($PKGS) and not root"
		exit 1
	fi
	log "installing $PKGS"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $PKGS >/dev/null
fi

mkdir -p "$VM_DIR"
cd "$VM_DIR"

# --- kernel ---------------------------------------------------------------
case "$VM_SERIES" in
6.1) KPAT='^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
*) KPAT="^linux-image-$(echo "$VM_SERIES" | sed 's/\./\\./g')\\.[0-9]+\\+deb12-amd64\$" ;;
esac
# A kernel of another series (an older .vm/) is replaced.
if [ -f kernel/version ]; then
	case "$(cat kernel/version)" in "$VM_SERIES".*) ;; *) rm -rf kernel ;; esac
fi
if [ ! -f kernel/vmlinuz ] || [ ! -f kernel/version ] || [ ! -f kernel/modules/modules.dep ]; then
	newest() { apt-cache search --names-only "$KPAT" | awk '{print $1}' | sort -V | tail -n 1; }
	pkg=${VM_KERNEL:-$(newest)}
	if [ -z "$pkg" ] && [ "$(id -u)" -eq 0 ]; then
		apt-get update -q >/dev/null # package lists may have been cleaned
		pkg=$(newest)
	fi
	if [ -z "$pkg" ] && [ "$(id -u)" -eq 0 ] && [ "$VM_SERIES" != 6.1 ]; then
		log "no $KPAT in the apt sources: adding bookworm-backports"
		echo "deb http://deb.debian.org/debian bookworm-backports main" >/etc/apt/sources.list.d/tf-vm-backports.list
		apt-get update -q >/dev/null
		pkg=$(newest)
	fi
	if [ -z "$pkg" ]; then
		log "no package matching $KPAT in the apt sources"
		exit 1
	fi
	log "downloading $pkg"
	rm -rf dl kernel.tmp
	mkdir -p dl kernel.tmp
	(cd dl && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null)
	dpkg -x dl/*.deb kernel.tmp/root
	ver=$(ls kernel.tmp/root/lib/modules | head -n 1)
	# The package ships no modules.dep (the installer runs depmod).
	depmod -b kernel.tmp/root "$ver"
	cp "kernel.tmp/root/boot/vmlinuz-$ver" kernel.tmp/vmlinuz
	echo "$ver" >kernel.tmp/version
	mv kernel.tmp/root/lib/modules/"$ver" kernel.tmp/modules
	rm -rf kernel.tmp/root dl kernel
	mv kernel.tmp kernel
fi
ver=$(cat kernel/version)

# --- initramfs ------------------------------------------------------------
# Modules in load order: crc32_generic explicitly first (rdma_rxe needs the
# crc32 crypto algorithm but does not depend on it in modules.dep), then each
# wanted module after its dependencies.
WANT="crc32_generic rdma_rxe ib_uverbs rdma_ucm virtio_pci 9pnet_virtio 9p dummy"
if [ ! -f initramfs.cpio.gz ] || [ ! -f initramfs.stamp ] || [ "$(cat initramfs.stamp)" != "$ver $WANT" ]; then
	log "building initramfs for $ver"
	rm -rf initramfs.tmp
	mkdir -p initramfs.tmp/bin initramfs.tmp/modules initramfs.tmp/proc initramfs.tmp/sys \
		initramfs.tmp/dev initramfs.tmp/host initramfs.tmp/tmp
	cp /bin/busybox initramfs.tmp/bin/busybox
	for a in sh mount umount insmod mkdir sleep cat echo poweroff chroot ls dmesg; do
		ln -s busybox "initramfs.tmp/bin/$a"
	done
	dep=kernel/modules/modules.dep
	# path_of NAME: modules.dep path of module NAME (empty when built in).
	path_of() {
		awk -F: -v n="$1" '{p=$1; b=p; sub(/.*\//, "", b); sub(/\.ko(\.xz|\.zst|\.gz)?$/, "", b); gsub(/-/, "_", b); if (b == n) {print p; exit}}' "$dep"
	}
	order=""
	add_path() { # add_path MODPATH: add its deps (already transitive), then it
		case " $order " in *" $1 "*) return 0 ;; esac
		deps=$(awk -F: -v p="$1" '$1 == p {print $2; exit}' "$dep")
		# modules.dep lists the closure, innermost last: load in reverse.
		for d in $(echo "$deps" | tr ' ' '\n' | sed '/^$/d' | tac); do
			case " $order " in *" $d "*) ;; *) order="$order $d" ;; esac
		done
		order="$order $1"
	}
	for m in $WANT; do
		p=$(path_of "$(echo "$m" | tr - _)")
		if [ -z "$p" ]; then
			if grep -q "/$m.ko" kernel/modules/modules.builtin 2>/dev/null; then
				continue
			fi
			log "module $m not found for $ver"
			exit 1
		fi
		add_path "$p"
	done
	i=0
	: >initramfs.tmp/modules/order
	for p in $order; do
		i=$((i + 1))
		base=$(basename "$p")
		out=$(printf '%02d-%s' "$i" "${base%%.ko*}.ko")
		case "$p" in
		*.ko.xz) xz -dc "kernel/modules/$p" >"initramfs.tmp/modules/$out" ;;
		*.ko.zst) zstd -qdc "kernel/modules/$p" >"initramfs.tmp/modules/$out" ;;
		*.ko.gz) gzip -dc "kernel/modules/$p" >"initramfs.tmp/modules/$out" ;;
		*) cp "kernel/modules/$p" "initramfs.tmp/modules/$out" ;;
		esac
		echo "$out" >>initramfs.tmp/modules/order
	done
	cp "$REPO/scripts/vm/init.sh" initramfs.tmp/init
	chmod 755 initramfs.tmp/init
	(cd initramfs.tmp && find . | cpio -o -H newc --quiet | gzip -1) >initramfs.cpio.gz.tmp
	mv initramfs.cpio.gz.tmp initramfs.cpio.gz
	echo "$ver $WANT" >initramfs.stamp
	rm -rf initramfs.tmp
fi
# Rebuild when init.sh changed since the image was made.
if [ "$REPO/scripts/vm/init.sh" -nt initramfs.cpio.gz ]; then
	rm -f initramfs.stamp
	exec "$0" "$@"
fi
log "ready: kernel $ver in $VM_DIR"
