# The emulator the guests run on (sourced by run.sh, data-plane.sh and .ci/run).
#
# qemu before 8.0 keys a translated x86 block by its virtual address: every new process
# of a position-independent program (ASLR puts it somewhere new) has all its code
# translated again, and a process's first pass through code is 3-4x its cost on 8.0 and
# later, whose x86 blocks are PC-relative (TARGET_TB_PCREL) and found by physical
# address. That cost lands on user-space code only: Linux's CM is kernel code, translated
# once per boot. Measured on the harness's guests with qemu 7.2 (ASLR on / off):
# `ibcm --version` 45 / 11 ms, `rping -h` 36 / 10 ms, ibcm's rping client from start to
# its first REQ 127 / 31 ms against rping's 63 / 21. With qemu 10.0 ASLR makes no
# difference. So the harness wants qemu 8.0 or later; Debian 12 has it in
# bookworm-backports.

# debian_mirror: the Debian mirror apt's sources name for the main suite (deb822 or
# one-line), e.g. http://deb.debian.org/debian; fails when there is none.
debian_mirror() {
    local uri
    uri=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 || true)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
    [ -n "$uri" ] || return 1
    echo "${uri%/}"
}

# qemu_major: the installed qemu-system-x86_64's major version, or 0.
qemu_major() {
    local v
    v=$(qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p' | head -1)
    echo "${v:-0}"
}

# ensure_qemu: qemu-system-x86 8.0 or later, from bookworm-backports when the system's is
# older (Debian 12 ships 7.2). Prints what it did; returns 1 when no such qemu could be
# installed (the caller decides whether an older one will do).
ensure_qemu() {
    [ "$(qemu_major)" -ge 8 ] && return 0
    local mirror list=/etc/apt/sources.list.d/ibcm-bookworm-backports.list
    if [ "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" = bookworm ] &&
        mirror=$(debian_mirror); then
        if ! grep -rqs -- 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            echo "deb $mirror bookworm-backports main" >"$list"
            echo "added bookworm-backports ($mirror) to apt's sources, for qemu 8.0 or later"
        fi
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -t bookworm-backports qemu-system-x86 >/tmp/ibcm-qemu-apt.log 2>&1 ||
            tail -5 /tmp/ibcm-qemu-apt.log >&2
    fi
    [ "$(qemu_major)" -ge 8 ]
}
