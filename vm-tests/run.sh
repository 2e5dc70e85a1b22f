#!/bin/sh
# Run ebpf-probes' kernel tests inside qemu (TCG) on Debian's cloud kernels.
#
#   vm-tests/run.sh [6.1|6.12 ...]     (cargo xtask vm-test runs it)
#
# Needs qemu-system-x86, busybox-static and apt-get download access to Debian's archive.
# Each VM boots the kernel with an initramfs holding busybox, the test binary and its
# shared libraries, runs the tests as root and powers off; the script fails if any does.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/vm-tests/.cache"
mkdir -p "$cache"
versions=${*:-"6.1 6.12"}

for tool in qemu-system-x86_64 busybox cpio dpkg-deb; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install qemu-system-x86 busybox-static cpio)"; exit 2; }
done
busybox_bin=$(command -v busybox)

# The integration test binary, built on the host.
test_bin=$(cd "$root" && cargo test -p sluice-ebpf-probes --test kernel --no-run 2>&1 \
    | sed -n 's/.*(\(.*target\/debug\/deps\/kernel-[0-9a-f]*\)).*/\1/p' | tail -1)
case "$test_bin" in /*) ;; *) test_bin="$root/$test_bin" ;; esac
[ -x "$test_bin" ] || { echo "could not find the kernel test binary ($test_bin)"; exit 2; }

package_for() {
    # "6.1" must not match 6.12: the version is followed by '.' or '-'.
    apt-cache search --names-only "^linux-image-$(echo "$1" | sed 's/\./\\./g')[.-][.0-9+a-z-]*-cloud-amd64-unsigned\$" \
        | awk '{print $1}' | sort -V | tail -1
}

fail=0
for v in $versions; do
    pkg=$(package_for "$v")
    [ -n "$pkg" ] || { echo "no Debian cloud kernel package for $v"; fail=1; continue; }
    kdir="$cache/$pkg"
    if [ ! -d "$kdir" ]; then
        (cd "$cache" && apt-get download "$pkg" >/dev/null 2>&1)
        mkdir -p "$kdir" && dpkg-deb -x "$cache/${pkg}"_*.deb "$kdir"
    fi
    vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)

    initrd_dir=$(mktemp -d)
    mkdir -p "$initrd_dir/bin" "$initrd_dir/proc" "$initrd_dir/sys" "$initrd_dir/dev" "$initrd_dir/tmp"
    cp "$busybox_bin" "$initrd_dir/bin/busybox"
    cp "$test_bin" "$initrd_dir/kernel-tests"
    for lib in $(ldd "$test_bin" | grep -o '/[^ ]*'); do
        mkdir -p "$initrd_dir$(dirname "$lib")" && cp -L "$lib" "$initrd_dir$lib"
    done
    fuse_ko=$(find "$kdir/lib/modules" -name 'fuse.ko*' | head -1)
    [ -n "$fuse_ko" ] && cp "$fuse_ko" "$initrd_dir/fuse.ko${fuse_ko##*fuse.ko}"
    cat > "$initrd_dir/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin TMPDIR=/tmp
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tracefs nodev /sys/kernel/tracing
mount -t cgroup2 none /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
[ -e /fuse.ko ] && insmod /fuse.ko
echo "VMTEST-KERNEL: $(uname -r)"
/kernel-tests --test-threads=1 --nocapture
echo "VMTEST-RESULT: rc=$?"
poweroff -f
INIT
    chmod +x "$initrd_dir/init"
    initrd="$cache/initrd-$v.cpio.gz"
    (cd "$initrd_dir" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$initrd")
    rm -rf "$initrd_dir"

    log="$cache/console-$v.log"
    echo "== $pkg: booting under qemu (TCG), console in $log"
    # One vCPU: attaching a tracepoint patches kernel text (jump labels) through int3
    # breakpoints, and multi-threaded TCG can run a stale translation of the patched code
    # on the other vCPU after the patch completed: an "Oops: int3" in __schedule on 6.12.
    timeout 600 qemu-system-x86_64 -machine q35 -accel tcg -m 2048 -smp 1 -nographic -no-reboot \
        -kernel "$vmlinuz" -initrd "$initrd" -append "console=ttyS0 panic=-1 quiet" >"$log" 2>&1 || true
    grep -E "^test |^test result|VMTEST-|panicked|skipped" "$log" || true
    if grep -q "VMTEST-RESULT: rc=0" "$log"; then echo "== $v: ok"; else echo "== $v: FAILED"; fail=1; fi
done
exit $fail
