#!/usr/bin/env bash
# Builds the Linux peer's boot files for the interop harness: a Debian 12 kernel and an
# initramfs holding busybox, rdma-core's tools and libraries, and the modules of soft-RoCE
# (rdma_rxe) and the kernel CM (ib_cm, rdma_cm), loaded by tests/interop/guest-init.sh.
#
# Everything comes from Debian packages fetched with `apt-get download` (never installed on
# the host) and is cached under target/interop/: a re-run with the same inputs does nothing.
#
#   tests/interop/build-guest.sh [OUT_DIR]      (default: target/interop)
#
# With IBCM_GUEST_BIN=PATH the initramfs also carries that `ibcm` binary (stripped, at
# /usr/bin/ibcm) and the libraries it needs, and is named initrd-ibcm.cpio: the data-plane
# harness (tests/interop/data-plane.sh) boots it on both of its guests.
#
# Prints the paths of the kernel and the initramfs on its last two lines.
set -euo pipefail
# modinfo, ip and friends live in sbin, which a non-login root shell (a chroot, sudo -s)
# may not have on its PATH.
export PATH="$PATH:/usr/sbin:/sbin"

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/interop}"
debs="$out/debs"
mkdir -p "$debs"

die() { echo "build-guest: $*" >&2; exit 1; }

for tool in apt-get apt-cache dpkg-deb readelf modinfo cpio busybox; do
    command -v "$tool" >/dev/null || die "$tool is missing (run.sh installs busybox-static, cpio, kmod, binutils)"
done
[ -x /bin/busybox ] || die "/bin/busybox is missing (apt-get install busybox-static)"
if readelf -d /bin/busybox 2>/dev/null | grep -q NEEDED; then
    die "/bin/busybox is dynamically linked; install busybox-static"
fi

# The kernel flavour with rdma_rxe.ko (the -cloud- one lacks it): whatever
# linux-image-amd64 depends on today.
resolve_kernel() {
    apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
kpkg="$(resolve_kernel)"
if [ -z "$kpkg" ]; then
    # A fresh machine may have no package lists yet.
    apt-get update >/dev/null 2>&1 || true
    kpkg="$(resolve_kernel)"
fi
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 (apt-get update failed?)"
kver="${kpkg#linux-image-}"

# The guest's user space: rdma-core's tools, the rxe verbs provider, `rdma` from iproute2,
# and the shared libraries they load (checked below against what readelf says they need).
packages=(
    "$kpkg" rdma-core ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils ibverbs-utils
    iproute2 libc6 libgcc-s1 libnl-3-200 libnl-route-3-200 libmnl0 libbsd0 libmd0 libcap2
    perftest libibumad3 libpci3 libudev1 zlib1g
)

ibcm_bin="${IBCM_GUEST_BIN:-}"
initrd="$out/initrd.cpio"
stamp="$out/guest.stamp"
if [ -n "$ibcm_bin" ]; then
    [ -x "$ibcm_bin" ] || die "IBCM_GUEST_BIN=$ibcm_bin is not an executable"
    initrd="$out/initrd-ibcm.cpio"
    stamp="$out/guest-ibcm.stamp"
fi
want="$( (printf '%s\n' "${packages[@]}"; cat "$here/guest-init.sh" "$here/build-guest.sh"; [ -z "$ibcm_bin" ] || cat "$ibcm_bin" "$here/qp-observe.c") | sha256sum | cut -c1-32)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$out/vmlinuz" ] && [ -f "$initrd" ]; then
    echo "build-guest: cached ($out)" >&2
    echo "$out/vmlinuz"
    echo "$initrd"
    exit 0
fi

echo "build-guest: fetching ${#packages[@]} Debian packages into $debs" >&2
(
    cd "$debs"
    for p in "${packages[@]}"; do
        if ! ls "${p}"_*.deb >/dev/null 2>&1; then
            apt-get download "$p" >/dev/null 2>"$debs/.err" || { cat "$debs/.err" >&2; die "apt-get download $p failed"; }
        fi
    done
)

stage="$out/stage${ibcm_bin:+-ibcm}"
x="$out/extract${ibcm_bin:+-ibcm}"
rm -rf "$stage" "$x"
mkdir -p "$x"
for p in "${packages[@]}"; do
    deb="$(ls "$debs/${p}"_*.deb | head -n1)"
    if [ "$p" = "$kpkg" ]; then
        # Only the kernel and the module trees the targets and their dependencies live in
        # (a dependency outside them fails below, loudly): a fraction of the package.
        dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$x" --wildcards \
            './boot/vmlinuz-*' \
            './lib/modules/*/kernel/drivers/infiniband/*' './lib/modules/*/kernel/drivers/virtio/*' \
            './lib/modules/*/kernel/drivers/net/virtio_net.ko' './lib/modules/*/kernel/drivers/net/net_failover.ko' \
            './lib/modules/*/kernel/net/*' './lib/modules/*/kernel/crypto/*' \
            './lib/modules/*/kernel/fs/configfs/*' './lib/modules/*/kernel/lib/*'
    else
        dpkg-deb -x "$deb" "$x"
    fi
done

mkdir -p "$stage"/{bin,sbin,dev,proc,sys,tmp,etc,lib64,usr/bin,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu/libibverbs,etc/libibverbs.d,lib/modules}
cp /bin/busybox "$stage/bin/busybox"

# Binaries, then the closure of their NEEDED libraries within the extracted packages.
bins=(usr/bin/cmtime usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/rdma
    usr/bin/ib_read_bw usr/bin/ib_send_bw usr/bin/ib_write_bw usr/bin/ib_read_lat usr/bin/ib_send_lat)
provider=usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
for b in "${bins[@]}"; do
    [ -f "$x/$b" ] || die "$b is not in the packages"
    cp "$x/$b" "$stage/usr/bin/"
done
if [ -n "$ibcm_bin" ]; then
    # The library closure below runs over it like the packaged binaries.
    strip -o "$x/usr/bin/ibcm" "$ibcm_bin"
    cp "$x/usr/bin/ibcm" "$stage/usr/bin/ibcm"
    bins+=(usr/bin/ibcm)
    # The ibv_modify_qp observer (qp-observe.c) for the Linux side's QPs, built against the
    # host's verbs.h: host and guest are both Debian 12 (glibc 2.36, rdma-core's stable
    # verbs ABI). The harness runs Linux's tools under LD_PRELOAD of it.
    command -v gcc >/dev/null && [ -f /usr/include/infiniband/verbs.h ] ||
        die "gcc and libibverbs-dev are needed for qp-observe.c"
    gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o "$stage/usr/lib/ibcm-qp-observe.so" "$here/qp-observe.c" -ldl ||
        die "building qp-observe.c failed"
fi
[ -f "$x/$provider" ] || die "the rxe verbs provider ($provider) is not in the packages"
cp "$x/$provider" "$stage/$provider"
cp "$x"/etc/libibverbs.d/rxe.driver "$stage/etc/libibverbs.d/"

find_lib() {
    local d
    for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
        if [ -e "$x/$d/$1" ]; then echo "$d/$1"; return 0; fi
    done
    return 1
}
declare -A seen=()
queue=("${bins[@]/#/$x/}" "$x/$provider")
while [ ${#queue[@]} -gt 0 ]; do
    f="${queue[0]}"; queue=("${queue[@]:1}")
    for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        [ -n "${seen[$lib]:-}" ] && continue
        rel="$(find_lib "$lib")" || die "$lib (needed by ${f#$x/}) is in none of the packages"
        seen[$lib]=1
        mkdir -p "$stage/$(dirname "$rel")"
        cp -L "$x/$rel" "$stage/$rel"
        queue+=("$x/$rel")
    done
done
# glibc loads libgcc_s at run time (pthread_cancel, unwinding): ldd does not list it.
cp -L "$(find_lib libgcc_s.so.1 | sed "s|^|$x/|")" "$stage/lib/x86_64-linux-gnu/"
cp -L "$x/lib64/ld-linux-x86-64.so.2" "$stage/lib64/" 2>/dev/null ||
    cp -L "$x/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$stage/lib64/"

# Modules: the targets and their dependencies, in load order (dependencies first).
kmods="$x/lib/modules/$kver"
[ -d "$kmods" ] || die "no modules for $kver in $kpkg"
declare -A path_of=() state=()
while IFS= read -r f; do
    n="$(basename "$f" .ko)"
    path_of[$n]="$f"
done < <(find "$kmods/kernel" -name '*.ko')
order=()
visit() {
    local m="$1" d
    [ "${state[$m]:-}" = done ] && return 0
    [ -n "${path_of[$m]:-}" ] || die "module $m is not in $kpkg"
    for d in $(modinfo -F depends "${path_of[$m]}" | tr ',' ' '); do visit "$d"; done
    state[$m]=done
    order+=("$m")
}
for m in virtio_pci virtio_net crc32_generic rdma_rxe ib_cm rdma_cm rdma_ucm ib_umad ib_uverbs; do
    visit "$m"
done
: > "$stage/modules.order"
for m in "${order[@]}"; do
    cp "${path_of[$m]}" "$stage/lib/modules/$m.ko"
    echo "$m" >> "$stage/modules.order"
done

cp "$here/guest-init.sh" "$stage/init"
chmod 755 "$stage/init"

(cd "$stage" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$initrd"
cp "$x/boot/vmlinuz-$kver" "$out/vmlinuz"
rm -rf "$x"
echo "$want" > "$stamp"
echo "build-guest: kernel $kver, ${#order[@]} modules ($(tr '\n' ' ' < "$stage/modules.order")), initramfs $(du -h "$initrd" | cut -f1)" >&2
echo "$out/vmlinuz"
echo "$initrd"
