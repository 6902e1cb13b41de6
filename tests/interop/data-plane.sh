#!/usr/bin/env bash
# Data-plane harness: connections that carry data. ibcm sets up real RC QPs on soft-RoCE
# (rdma_rxe) and exchanges verified traffic, RDMA READ included, with Linux rdma_cm peers
# in both roles, and with itself across two machines.
#
#   tests/interop/data-plane.sh [SCENARIO...]     (as root; default: every scenario)
#
# Scenarios: ibcm-ibcm ibcm-ibcm-bw linux-server linux-client ucmatose-server
# ucmatose-client ucmatose-many udaddy-ibcm udaddy-server udaddy-client perftest-server perftest-client
# perftest-write perftest-lat perftest-refuse port-down reject-linux reject-ibcm
# req-timeout disconnect-in-flight peer-gone baseline, port-flap (a link flap shorter than the
# connection's deadline: it survives, issue 29), and the cmtime scenarios of
# data-plane-cmtime.sh (cmtime-ibcm cmtime-linux-server cmtime-linux-client
# cmtime-baseline: connection setup timed as rdma-core cmtime times it, against Linux's
# cmtime in both roles).
#
# - perftest-server / perftest-client: perftest's `ib_read_bw -R` and `ib_send_bw -R`
#   (rdma_cm mode: a control connection for its parameters, then the data connection)
#   against `ibcm perftest` in both roles; RDMA READ with asymmetric read limits and
#   against a default server (no -o: 128 granted), every READ checked, every received SEND
#   length-checked and, above half the cycle buffer, compared with the first.
# - udaddy-ibcm: `ibcm udaddy` on both guests (B's CM not loaded yet).
# - udaddy-server / udaddy-client: rdma-core's `udaddy` (UD QPs resolved with SIDR on
#   rdma_cm's UDP port space) against `ibcm udaddy` in both roles: SIDR_REQ/SIDR_REP with
#   rdma_cm's Q_Key, UD_COUNT datagrams each way, every reply to ibcm checked as the echo
#   of its own datagram (udaddy's server sends back its receive buffer), counts and exit
#   codes on both sides.
# - perftest-write: `ib_write_bw -R` against `ibcm perftest --test write`, both roles.
# - perftest-lat: `ib_read_lat -R` and `ib_send_lat -R` against `ibcm perftest --test
#   read-lat` / `send-lat`, both roles; ibcm prints perftest's latency figures.
# - perftest-refuse: a Linux perftest whose test is not ibcm's is refused (REFUSED, exit 1),
#   not served: a READ server facing ib_write_bw, a WRITE client facing ib_read_bw, a
#   read-lat server facing ib_read_bw.
# - ucmatose-many: `ucmatose -c UC_MANY` (20) connections in one process, both roles.
# - port-down: A's eth0 goes down while ibcm pings a Linux `rping -s -P`; rxe's
#   IBV_EVENT_PORT_ERR reaches ibcm's engine as Device::port_down, the application gets
#   one CM event ending the connection, the QP's transport fails the work in flight
#   (RETRY_EXC), the engine holds nothing; the link comes back, the same process connects
#   again with a new QP and verifies 10 pings; Linux's side of the old connection ends.
#
# What it does, all of it self-contained and undone on exit (trap):
# - builds `ibcm` (feature `devices`: driver/linux, ib_umad + libibverbs) and the guest
#   (tests/interop/build-guest.sh with IBCM_GUEST_BIN: a Debian kernel, rdma-core's tools
#   and the ibcm binary in one initramfs, cached under target/interop/);
# - creates a network namespace holding a bridge and two tap devices, no address on the
#   host side, no route out, IPv6 off, and boots two qemu TCG guests on it: A (10.77.0.3)
#   runs ibcm, B (10.77.0.2) runs stock rdma-core. Both boot without the kernel's CM
#   (ib_cm, iw_cm, rdma_cm, rdma_ucm: ibcm needs the CM class free on ib_umad), so the
#   first scenarios run ibcm on both; then B loads its CM, and at the end A loads its own
#   for the Linux-Linux baseline on the same guests;
# - after each connection prints both QPs (ibv_query_qp on ours, `rdma resource show qp`
#   on Linux's) and asserts ours.sq_psn = theirs.rq_psn, ours.rq_psn = theirs.sq_psn, the
#   QPNs crossed, the MTU, the read limits (ibcm-ibcm: both QPs queried; ibcm-Linux: the
#   attributes Linux's process really put on its QP, observed by an ibv_modify_qp
#   LD_PRELOAD shim in guest B, tests/interop/qp-observe.c, beside the prediction of
#   usermode-lib/cli/src/rc.rs LinuxQp, the qp-linux-cm line);
# - times, in linux-server, process start to the first REQ of ibcm's rping client and of
#   Linux `rping -c`, in turn (first_req: the bridge captured, an ICMP echo marking each
#   start);
# - prints a PASS/FAIL line per scenario, the figures beside Linux's, the total time.
#
# Environment: IBCM_PROFILE (debug|release, default release), IBCM_DP_OUT (results, default
# target/interop/data-plane), IBCM_DP_PINGS (pings per rping run, default 50),
# IBCM_DP_SIZE (bytes per ping, default 4096).
set -euo pipefail
# modinfo, ip and friends live in sbin, which a non-login root shell (a chroot, sudo -s)
# may not have on its PATH.
export PATH="$PATH:/usr/sbin:/sbin"

here="$(cd "$(dirname "$0")" && pwd)"
source "$here/guest-ctl.sh"
repo="$(cd "$here/../.." && pwd)"
PROFILE="${IBCM_PROFILE:-release}"
OUT="${IBCM_DP_OUT:-$repo/target/interop/data-plane}"
PINGS="${IBCM_DP_PINGS:-50}"
# Fresh rping pairs timed per setup_frames row (the median's).
SETUP_PAIRS=9
SIZE="${IBCM_DP_SIZE:-4096}"
A_IP=10.77.0.3
B_IP=10.77.0.2
DEAD_IP=10.77.0.9
CM_MODULES=iw_cm,ib_cm,rdma_cm,rdma_ucm
ALL_SCENARIOS=(ibcm-ibcm ibcm-ibcm-bw cmtime-ibcm udaddy-ibcm linux-server linux-client ucmatose-server ucmatose-client ucmatose-many udaddy-server udaddy-client perftest-server perftest-client perftest-write perftest-lat perftest-refuse cmtime-linux-server cmtime-linux-client port-down port-flap reject-linux reject-ibcm req-timeout disconnect-in-flight peer-gone baseline cmtime-baseline)
t_start=$(date +%s.%N)

die() { echo "data-plane: FAIL: $*" >&2; exit 1; }
note() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $t_start" | bc)" "$*"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (network namespace, tap devices)"
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=("${ALL_SCENARIOS[@]}")
for s in "${scenarios[@]}"; do
    case " ${ALL_SCENARIOS[*]} " in *" $s "*) ;; *) die "unknown scenario $s (known: ${ALL_SCENARIOS[*]})" ;; esac
done

# ---- host packages ------------------------------------------------------------------------
need=()
# The guests' emulator: 8.0 or later, from bookworm-backports where the system's is older
# (qemu-tcg.sh says why); else any qemu, and its timings are flagged.
# shellcheck source=tests/interop/qemu-tcg.sh
source "$here/qemu-tcg.sh"
ensure_qemu || command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && ! readelf -d /bin/busybox 2>/dev/null | grep -q NEEDED || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v modinfo >/dev/null || need+=(kmod)
command -v ip >/dev/null || need+=(iproute2)
command -v readelf >/dev/null || need+=(binutils)
command -v bc >/dev/null || need+=(bc)
# first_req captures the bridge (linux-server, baseline).
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
    note "installing host packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${need[@]}" >/tmp/ibcm-dp-apt.log 2>&1; then
        apt-get update >>/tmp/ibcm-dp-apt.log 2>&1 || true
        apt-get install -y --no-install-recommends "${need[@]}" >>/tmp/ibcm-dp-apt.log 2>&1 ||
            { tail -20 /tmp/ibcm-dp-apt.log >&2; die "apt-get install ${need[*]} failed"; }
    fi
fi
[ -c /dev/net/tun ] || die "/dev/net/tun is missing: no tap devices here"

# ---- binaries and guest -------------------------------------------------------------------
note "building ibcm ($PROFILE, feature devices)"
cargo_flags=()
[ "$PROFILE" = release ] && cargo_flags+=(--release)
(cd "$repo" && nice cargo build -q "${cargo_flags[@]}" -p ibcm-cli --features devices --bin ibcm) || die "cargo build failed"
IBCM_BIN="$repo/target/$PROFILE/ibcm"

note "guest: building (cached under target/interop)"
mapfile -t boot < <(IBCM_GUEST_BIN="$IBCM_BIN" "$here/build-guest.sh" "$repo/target/interop")
[ "${#boot[@]}" -ge 2 ] || die "guest build failed (see above)"
KERNEL="${boot[0]}"
INITRD="${boot[1]}"
[ -f "$KERNEL" ] && [ -f "$INITRD" ] || die "guest build produced no kernel/initramfs"

# ---- namespace, VMs, cleanup --------------------------------------------------------------
NS="ibcm-dp-$$"
WORK="$(mktemp -d /tmp/ibcm-dp.XXXXXX)"
rm -rf "$OUT"
mkdir -p "$OUT"
declare -A QEMU_PID=()
cleanup() {
    local rc=$?
    set +e
    for g in "${!QEMU_PID[@]}"; do
        local p="${QEMU_PID[$g]}"
        kill "$p" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    ip netns del "$NS" 2>/dev/null
    for g in A B; do [ -f "$WORK/console.$g" ] && cp "$WORK/console.$g" "$OUT/guest-$g-console.log"; done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS" || die "cannot create network namespace $NS"
ip netns exec "$NS" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6'
ip -n "$NS" link set lo up
ip -n "$NS" link add br0 type bridge stp_state 0 forward_delay 0
for t in tap0 tap1; do
    ip -n "$NS" tuntap add dev "$t" mode tap || die "cannot create $t in $NS"
    ip -n "$NS" link set "$t" master br0
    ip -n "$NS" link set "$t" up
done
ip -n "$NS" link set br0 up
[ -z "$(ip -n "$NS" route show default)" ] || die "the namespace has a default route"

declare -A CTL_W=() CTL_R=()
boot_guest() { # boot_guest NAME TAP ADDR MAC
    local g="$1" w r
    mkfifo "$WORK/ctl.$g.in" "$WORK/ctl.$g.out"
    exec {w}<>"$WORK/ctl.$g.in" {r}<>"$WORK/ctl.$g.out"
    CTL_W[$g]=$w
    CTL_R[$g]=$r
    ip netns exec "$NS" nice qemu-system-x86_64 -accel tcg -cpu max -m 384M -smp 1 \
        -nodefaults -display none -no-reboot -monitor none \
        -kernel "$KERNEL" -initrd "$INITRD" \
        -append "console=ttyS0 panic=-1 quiet loglevel=4 ibcm.addr=$3/24 ibcm.skip=$CM_MODULES" \
        -serial "file:$WORK/console.$g" -serial "pipe:$WORK/ctl.$g" \
        -netdev tap,id=n0,ifname="$2",script=no,downscript=no \
        -device virtio-net-pci,netdev=n0,mac="$4" \
        >"$WORK/qemu.$g" 2>&1 &
    QEMU_PID[$g]=$!
}
wait_ready() { # wait_ready NAME
    local line
    while IFS= read -r -t 180 line <&"${CTL_R[$1]}"; do
        case "$line" in *@@READY*) return 0 ;; esac
    done
    cat "$WORK/qemu.$1" >&2
    tail -30 "$WORK/console.$1" >&2 || true
    die "guest $1 did not come up within 180 s"
}
QEMU_VERSION="$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')"
note "booting guest A (ibcm, $A_IP) and guest B (Linux rdma-core, $B_IP) under qemu $QEMU_VERSION TCG in $NS"
boot_guest A tap0 "$A_IP" 52:54:00:77:00:03
boot_guest B tap1 "$B_IP" 52:54:00:77:00:02
wait_ready A
wait_ready B
note "guests ready: $(grep -a 'guest: eth0' "$WORK/console.A" | tail -1); $(grep -a 'guest: eth0' "$WORK/console.B" | tail -1)"

# guest NAME TIMEOUT COMMAND: runs COMMAND in guest NAME's shell, prints its output,
# returns its status (124 if no answer within TIMEOUT seconds of silence).
# The control line's protocol is tests/interop/guest-ctl.sh's.
guest() { ctl_run "${CTL_W[$1]}" "${CTL_R[$1]}" "$2" "$3" "guest $1"; }
# bg NAME TAG COMMAND: starts COMMAND in guest NAME in the background (bounded by
# `timeout 150`), output to /tmp/TAG.log, exit status appended as "exit=N".
bg() { guest "$1" 10 "(timeout 150 $3; echo exit=\$?) > /tmp/$2.log 2>&1 & echo \$! > /tmp/$2.pid" >/dev/null; }
# bg_wait NAME TAG FILE: waits (bounded) for a background command, copies its log to FILE.
bg_wait() {
    guest "$1" 170 "i=0; while kill -0 \$(cat /tmp/$2.pid) 2>/dev/null && [ \$i -lt 1600 ]; do sleep 0.1; i=\$((i+1)); done; cat /tmp/$2.log" >"$3" 2>&1 || true
}
# wait_listening NAME TAG: until the background ibcm in NAME logs that it listens (15 s).
wait_listening() { guest "$1" 30 "i=0; until grep -q 'listening on' /tmp/$2.log 2>/dev/null || [ \$i -ge 150 ]; do sleep 0.1; i=\$((i+1)); done; grep -q 'listening on' /tmp/$2.log"; }
# qp_snapshots NAME TAG: records `rdma resource show qp` every 0.25 s for 40 s.
qp_snapshots() { guest "$1" 10 "(i=0; while [ \$i -lt 160 ]; do rdma resource show qp; echo ---; sleep 0.25; i=\$((i+1)); done) > /tmp/$2.qp 2>&1 & echo \$! > /tmp/$2.qpid" >/dev/null; }
qp_snapshots_get() { guest "$1" 10 "kill \$(cat /tmp/$2.qpid) 2>/dev/null; cat /tmp/$2.qp" >"$3" 2>&1 || true; }

declare -A RESULT=() WHY=() SECS=() FIG=()
fail() { WHY[$current]+="$*; "; }
check() { local what="$1"; shift; if ! "$@"; then fail "$what"; fi; }
has() { grep -q -- "$2" "$1"; }
eq() { [ "$1" = "$2" ]; }
# kv FILE LINE-PREFIX KEY: KEY's value on the first line of FILE starting with PREFIX.
kv() { awk -v p="$2" -v k="$3" '$1==p { for (i=2;i<=NF;i++) { split($i,a,"="); if (a[1]==k) {print a[2]; exit} } }' "$1"; }

# qp_pair NAME OURS-FILE THEIRS-FILE: ibcm's QP (qp-ours) against ibcm's QP on the other
# guest: everything crossed, printed.
qp_pair() {
    local a="$2" b="$3"
    [ -n "$(kv "$a" qp-ours qpn)" ] && [ -n "$(kv "$b" qp-ours qpn)" ] || { fail "no qp-ours line on both sides"; return 0; }
    echo "  QP A: $(grep '^qp-ours ' "$a" | head -1)"
    echo "  QP B: $(grep '^qp-ours ' "$b" | head -1)"
    check "A.sq_psn = B.rq_psn" eq "$(kv "$a" qp-ours sq_psn)" "$(kv "$b" qp-ours rq_psn)"
    check "A.rq_psn = B.sq_psn" eq "$(kv "$a" qp-ours rq_psn)" "$(kv "$b" qp-ours sq_psn)"
    check "A.dest_qpn = B.qpn" eq "$(kv "$a" qp-ours dest_qpn)" "$(kv "$b" qp-ours qpn)"
    check "B.dest_qpn = A.qpn" eq "$(kv "$b" qp-ours dest_qpn)" "$(kv "$a" qp-ours qpn)"
    check "path MTU 1024 on both" eq "$(kv "$a" qp-ours path_mtu)/$(kv "$b" qp-ours path_mtu)" "3/3"
    check "A.max_rd_atomic = B.max_dest_rd_atomic" eq "$(kv "$a" qp-ours max_rd_atomic)" "$(kv "$b" qp-ours max_dest_rd_atomic)"
    check "B.max_rd_atomic = A.max_dest_rd_atomic" eq "$(kv "$b" qp-ours max_rd_atomic)" "$(kv "$a" qp-ours max_dest_rd_atomic)"
}

# qp_linux OURS-FILE SNAPSHOTS: ibcm's QP against the Linux QP whose QPNs cross it, in
# some snapshot of `rdma resource show qp` taken while the connection was quiet.
qp_linux() {
    local f="$1" snaps="$2"
    local qpn dest sq rq
    qpn="$(kv "$f" qp-ours qpn)"; dest="$(kv "$f" qp-ours dest_qpn)"
    sq="$(kv "$f" qp-ours sq_psn)"; rq="$(kv "$f" qp-ours rq_psn)"
    [ -n "$qpn" ] && [ -n "$dest" ] && [ -n "$sq" ] && [ -n "$rq" ] || { fail "no qp-ours line"; return 0; }
    echo "  QP ibcm:  $(grep '^qp-ours ' "$f" | head -1)"
    local theirs
    theirs="$(awk -v l="$dest" '{ for (i=1;i<NF;i++) if ($i=="lqpn" && $(i+1)==l && / RC /) { print; next } }' "$snaps" | sort | uniq -c | sort -rn | head -3)"
    echo "  QP Linux (distinct snapshots, most frequent first):"
    printf '%s\n' "$theirs" | sed 's/^/    /'
    check "Linux has an RC QP $dest whose remote QPN is ours ($qpn)" eval "awk -v l='$dest' -v r='$qpn' '{ for (i=1;i<NF;i++) { if (\$i==\"lqpn\") a=\$(i+1); if (\$i==\"rqpn\") b=\$(i+1) } if (a!=\"\" && a==l && b==r) f=1; a=b=\"\" } END { exit !f }' '$snaps'"
    check "a Linux snapshot has rq-psn = our sq_psn ($sq) and sq-psn = our rq_psn ($rq)" eval "awk -v l='$dest' -v s='$sq' -v q='$rq' '{ a=r1=s1=\"\"; for (i=1;i<NF;i++) { if (\$i==\"lqpn\") a=\$(i+1); if (\$i==\"rq-psn\") r1=\$(i+1); if (\$i==\"sq-psn\") s1=\$(i+1) } if (a!=\"\" && a==l && r1==s && s1==q) f=1 } END { exit !f }' '$snaps'"
    check "our path MTU is rxe's 1024" eq "$(kv "$f" qp-ours path_mtu)" 3
}

# The ibv_modify_qp observer (tests/interop/qp-observe.c, in guest B's image): Linux's rdma_cm
# tools run under it, each call logged with its attributes to /tmp/qp-modify.log.
OBS="env LD_PRELOAD=/usr/lib/ibcm-qp-observe.so"
obs_reset() { guest B 10 "rm -f /tmp/qp-modify.log" >/dev/null 2>&1 || true; }
# After a background job is killed the guest's control line has lost the head of the next
# command (baseline's note): a padding command takes that loss first.
obs_get() {
    guest B 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true
    guest B 10 "cat /tmp/qp-modify.log 2>/dev/null" >"$1" 2>&1 || true
}
# obs FILE QPN KEY: the last value of KEY that Linux's calls for QP QPN set (rc=0 only).
obs() { awk -v q="qpn=$2" -v k="$3" '$1=="qp-modify" && $2==q && $4=="rc=0" { for (i=5;i<=NF;i++) { split($i,a,"="); if (a[1]==k) v=a[2] } } END { print v }' "$1"; }
pow2() { local n="$1" p=1; [ -n "$n" ] || { echo ""; return; }; [ "$n" -gt 0 ] || { echo 0; return; }; while [ "$p" -lt "$n" ]; do p=$((p * 2)); done; echo "$p"; }

# qp_observed OURS-FILE OBS-LOG [quiet | N]: ibcm's QP (ibv_query_qp, the qp-ours line) against
# the attributes Linux's own process put on its QP (the observer's log), and the prediction
# rc.rs LinuxQp made from the REQ and REP (qp-linux-cm) beside them. Crossed: Linux's
# dest_qpn is our QPN, its rq_psn our sq_psn (and, when nothing has moved yet: quiet, its
# sq_psn our rq_psn; else its sq_psn at most N packets, default 16, behind our rq_psn: the
# receives ibcm had posted); the path MTUs equal; each side's initiator depth is the other's
# responder resources (cm.c cm_rep_handler crosses the REP, librdmacm cma.c:1918-1936 and
# 2346-2350 apply it), ours as rxe rounded it up to a power of two (rxe_qp.c
# rxe_qp_from_attr: roundup_pow_of_two) and Linux's as it asked; the transport retry count
# the same (both from the REQ, cm.c cm_req_handler / the active side's own).
qp_observed() {
    local f="$1" log="$2" quiet="" most=16
    case "${3:-}" in
        quiet) quiet=1 ;;
        '') ;;
        *) most="$3" ;;
    esac
    local qpn dest
    qpn="$(kv "$f" qp-ours qpn)"; dest="$(kv "$f" qp-ours dest_qpn)"
    [ -n "$qpn" ] && [ -n "$dest" ] || { fail "no qp-ours line"; return 0; }
    local seen
    seen="$(obs "$log" "$dest" state)"
    echo "  Linux's ibv_modify_qp calls on QP $dest (observed):"
    awk -v q="qpn=$dest" '$1=="qp-modify" && $2==q' "$log" | sed 's/^/    /'
    echo "  $(grep '^qp-linux-cm ' "$f" | head -1)  (prediction)"
    [ -n "$seen" ] || { fail "no observed ibv_modify_qp of Linux's QP $dest"; return 0; }
    local ldq lrq lsq lmtu lrd ldr lrc
    ldq="$(obs "$log" "$dest" dest_qpn)"; lrq="$(obs "$log" "$dest" rq_psn)"; lsq="$(obs "$log" "$dest" sq_psn)"
    lmtu="$(obs "$log" "$dest" path_mtu)"; lrd="$(obs "$log" "$dest" max_rd_atomic)"; ldr="$(obs "$log" "$dest" max_dest_rd_atomic)"
    lrc="$(obs "$log" "$dest" retry_cnt)"
    check "Linux QP $dest: dest_qpn ($ldq) = our QPN ($qpn)" eq "$ldq" "$qpn"
    check "Linux rq_psn ($lrq) = our sq_psn" eq "$lrq" "$(kv "$f" qp-ours sq_psn)"
    # Our rq_psn as queried: Linux's first PSN, or past the packets Linux sends at once
    # after the RTU into the receives ibcm posted (rping -c's first SEND, rping.c
    # rping_test_client; ucmatose's -C messages, cmatose.c).
    local d
    d="$(( ($(kv "$f" qp-ours rq_psn) - ${lsq:-0} + 16777216) % 16777216 ))"
    if [ -n "$quiet" ]; then
        check "Linux sq_psn ($lsq) = our rq_psn" eq "$lsq" "$(kv "$f" qp-ours rq_psn)"
    else
        check "Linux sq_psn ($lsq) = our rq_psn less the $d packets Linux sent before our query (<= $most)" eval "[ -n '$lsq' ] && [ '$d' -le $most ]"
    fi
    check "Linux path_mtu ($lmtu) = ours" eq "$lmtu" "$(kv "$f" qp-ours path_mtu)"
    check "our max_rd_atomic ($(kv "$f" qp-ours max_rd_atomic)) = Linux's max_dest_rd_atomic ($ldr) rounded up" eq "$(kv "$f" qp-ours max_rd_atomic)" "$(pow2 "$ldr")"
    check "our max_dest_rd_atomic ($(kv "$f" qp-ours max_dest_rd_atomic)) = Linux's max_rd_atomic ($lrd) rounded up" eq "$(kv "$f" qp-ours max_dest_rd_atomic)" "$(pow2 "$lrd")"
    check "retry_cnt: ours = Linux's ($lrc)" eq "$(kv "$f" qp-ours retry_cnt)" "$lrc"
    # Linux's RNR retry count is the one ibcm sent, 7 (usermode-lib/cli/src/rc.rs
    # rnr_retry_count): in the REQ when ibcm connects (cm.c cm_req_handler keeps the REQ's
    # RNR retry count, cm_init_qp_rts_attr applies it), in the REP when it accepts
    # (cm_rep_handler). When ibcm connects Linux's timeout is the REQ's LocalAckTimeout,
    # ibcm's own (cm_format_paths_from_req: packet_life_time = ack - 1; cm_init_av_by_path:
    # timeout = packet_life_time + 1).
    check "Linux rnr_retry ($(obs "$log" "$dest" rnr_retry)) = 7, ibcm's REQ/REP" eq "$(obs "$log" "$dest" rnr_retry)" 7
    if grep -q '^rc: established in .*(REP received' "$f"; then
        check "ibcm connected: Linux timeout ($(obs "$log" "$dest" timeout)) = ours, the REQ's LocalAckTimeout" eq "$(obs "$log" "$dest" timeout)" "$(kv "$f" qp-ours timeout)"
    fi
    check "prediction (qp-linux-cm) = observed read limits and MTU" eq "$(kv "$f" qp-linux-cm max_rd_atomic)/$(kv "$f" qp-linux-cm max_dest_rd_atomic)/$(kv "$f" qp-linux-cm path_mtu)" "$lrd/$ldr/$lmtu"
    echo "  timeout / rnr_retry / min_rnr_timer: ours $(kv "$f" qp-ours timeout) / $(kv "$f" qp-ours rnr_retry) / -, Linux $(obs "$log" "$dest" timeout) / $(obs "$log" "$dest" rnr_retry) / $(obs "$log" "$dest" min_rnr_timer)"
}

RDMA_PORT=7470
next_port() { RDMA_PORT=$((RDMA_PORT + 1)); }
# pings FILE: "V/N" of an ibcm rping report.
pings() { sed -n 's/^rping: \([0-9]*\)\/\([0-9]*\) pings verified.*/\1\/\2/p' "$1" | head -1; }
# uptime_ms FILE: the ms between the two guest uptimes of its "uptime=T0,T1" line (the
# guest's busybox `date` has no %N).
uptime_ms() { sed -n 's/^uptime=\([0-9.]*\),\([0-9.]*\).*/(\2 - \1) * 1000/p' "$1" | head -1 | bc 2>/dev/null | cut -d. -f1; }

# first_req N: process start to first REQ, ibcm's client and Linux rping's in turn, N of
# each, under the same load. ibcm's rping client on A against a persistent Linux
# `rping -s -P` on B, then Linux `rping -c` on B against an ibcm rping server on A (started
# before, so its own start is not timed). Each client is started right after one ICMP echo
# to the other guest, with the bridge captured: per run, the ms from the echo reply to that
# client (the start mark: the shell starts the client once it has come back) to the first
# CM REQ from its guest (UDP 4791, MAD class 0x07 at UDP byte 29, attribute 0x0010 at 44:
# 8 UDP + 12 BTH + 8 DETH bytes before the MAD). Sets FIG ibcm_first_req_ms and
# linux_first_req_ms to the medians and prints every run.
first_req() {
    local n="$1" pcap="$WORK/first-req.pcap" i cap lport="$RDMA_PORT"
    next_port
    local iport="$RDMA_PORT"
    guest B 10 "rping -s -P -a $B_IP -p $lport > /tmp/frs.log 2>&1 & echo \$! > /tmp/frs.pid" >/dev/null
    ip netns exec "$NS" tcpdump -i br0 --immediate-mode -n -s 128 -U -w "$pcap" \
        "icmp[icmptype] = icmp-echoreply or (udp dst port 4791 and udp[29] = 0x07 and udp[44:2] = 0x0010)" 2>"$WORK/tcpdump.first-req" &
    cap=$!
    for _ in $(seq 100); do grep -q 'listening on' "$WORK/tcpdump.first-req" 2>/dev/null && break; sleep 0.05; done
    sleep 1
    : >"$OUT/first-req.ibcm.txt"
    : >"$OUT/first-req.rping.txt"
    for i in $(seq "$n"); do
        guest A 60 "ping -c 1 -W 2 $B_IP >/dev/null; timeout 30 ibcm rping -I $A_IP -a $B_IP -p $lport -C 1 -S 64 >/tmp/fr.log 2>&1; echo exit=\$?; cat /tmp/fr.log" >>"$OUT/first-req.ibcm.txt" 2>&1 || true
        bg A frsrv "ibcm rping -I $A_IP -p $iport -S 64 --wait 30"
        wait_listening A frsrv || fail "ibcm rping server on A did not listen"
        guest B 60 "ping -c 1 -W 2 $A_IP >/dev/null; timeout 30 rping -c -a $A_IP -p $iport -C 1 -S 64 >/tmp/fr.log 2>&1; echo exit=\$?; cat /tmp/fr.log" >>"$OUT/first-req.rping.txt" 2>&1 || true
        bg_wait A frsrv "$OUT/first-req.server.$i.txt"
    done
    sleep 0.5
    kill "$cap" 2>/dev/null || true
    wait "$cap" 2>/dev/null || true
    guest B 10 "kill \$(cat /tmp/frs.pid)" >/dev/null 2>&1 || true
    # That kill costs the control line the head of the next command (as obs_get's note
    # says): a padding command takes the loss.
    guest B 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true
    tcpdump -r "$pcap" -n -tt 2>/dev/null >"$OUT/first-req.frames" || true
    local who ip ms got med
    for who in ibcm rping; do
        ip="$A_IP"
        [ "$who" = rping ] && ip="$B_IP"
        # "TS IP SRC > DST: ICMP echo reply ..." arms the guest DST; "TS IP SRC.PORT >
        # DST.4791: UDP ..." from an armed guest is its first REQ.
        ms="$(awk -v g="$ip" '/ICMP echo reply/ { d = $5; sub(/:$/, "", d); if (d == g) { t = $1; armed = 1 }; next }
            /UDP/ && armed { s = $3; sub(/\.[0-9]+$/, "", s); if (s == g) { printf "%.1f\n", ($1 - t) * 1000; armed = 0 } }' "$OUT/first-req.frames")"
        got="$(printf '%s\n' $ms | grep -c . || true)"
        med="$(printf '%s\n' $ms | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')"
        echo "  $who client: process start to first REQ, ms (median ${med:-n/a} of $got): $(echo $ms)"
        check "$who: $n clients exited 0" eq "$(grep -c '^exit=0' "$OUT/first-req.$who.txt")" "$n"
        check "$who: a REQ after every start mark ($got of $n)" eq "$got" "$n"
        if [ "$who" = ibcm ]; then FIG[ibcm_first_req_ms]="$med"; else FIG[linux_first_req_ms]="$med"; fi
    done
}

# setup_frames KEY CLIENT SERVER N: one connection's setup as the wire sees it, the same
# way for both stacks: N fresh pairs of rping processes (CLIENT and SERVER each "ibcm" or
# "linux"; the client on A and the server on B, or the other way round for a Linux client
# facing ibcm, whose CM then is only on B; each server makes its QP and buffers on the
# REQ, rping.c's order), one connection of one 64-byte ping each, the
# bridge captured. Per pair, the ms from the client's REQ to its RTU on the bridge's clock
# (both guests' frames, one clock: no guest's scheduling after its RTU, no CLI timer). A
# ping from the client's guest marks each start, so a pair without an RTU takes no
# other pair's. Sets FIG[setup_KEY_ms] to the median and prints every pair's.
setup_frames() {
    local key="$1" client="$2" server="$3" n="$4" pcap="$WORK/setup-$1.pcap" cap i out run
    local cg=A cip="$A_IP" sg=B sip="$B_IP"
    if [ "$client" = linux ] && [ "$server" = ibcm ]; then cg=B; cip="$B_IP"; sg=A; sip="$A_IP"; fi
    ip netns exec "$NS" tcpdump -i br0 --immediate-mode -n -s 128 -U -w "$pcap" \
        "icmp[icmptype] = icmp-echoreply or (udp dst port 4791 and udp[29] = 0x07 and (udp[44:2] = 0x0010 or udp[44:2] = 0x0014))" 2>"$WORK/tcpdump.setup-$key" &
    cap=$!
    for _ in $(seq 100); do grep -q 'listening on' "$WORK/tcpdump.setup-$key" 2>/dev/null && break; sleep 0.05; done
    : >"$OUT/setup-$key.txt"
    for i in $(seq "$n"); do
        next_port
        if [ "$server" = ibcm ]; then
            bg "$sg" sfs "ibcm rping -I $sip -p $RDMA_PORT -S 64 --wait 30"
            wait_listening "$sg" sfs || fail "setup $key: the ibcm rping server did not listen"
        else
            bg "$sg" sfs "rping -s -a $sip -p $RDMA_PORT -C 1 -S 64"
            sleep 1
        fi
        run="timeout 30 rping -c -a $sip -p $RDMA_PORT -C 1 -S 64 >/tmp/sf.log 2>&1; echo exit=\$?"
        [ "$client" = ibcm ] && run="timeout 30 ibcm rping -I $cip -a $sip -p $RDMA_PORT -C 1 -S 64 >/tmp/sf.log 2>&1; echo exit=\$?; grep '^rc: established' /tmp/sf.log"
        out="$(guest "$cg" 60 "ping -c 1 -W 2 $sip >/dev/null; $run" 2>&1 || true)"
        printf '%s\n' "$out" >>"$OUT/setup-$key.txt"
        # A client that failed (a Linux server not listening yet after its second) leaves
        # its server waiting for ever: ended here, not by its 150 s bound.
        if ! printf '%s\n' "$out" | grep -q '^exit=0'; then
            guest "$sg" 10 "kill \$(cat /tmp/sfs.pid) 2>/dev/null; true" >/dev/null 2>&1 || true
            guest "$sg" 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true
        fi
        bg_wait "$sg" sfs "$OUT/setup-$key.server.$i.txt"
    done
    sleep 0.5
    kill "$cap" 2>/dev/null || true
    wait "$cap" 2>/dev/null || true
    local ms got med
    # A capture that cannot be read fails this row's checks, not the run.
    {
        tcpdump -r "$pcap" -n -tt icmp 2>/dev/null | sed 's/^/M /' || true
        tcpdump -r "$pcap" -n -tt 'udp[44:2] = 0x0010' 2>/dev/null | sed 's/^/Q /' || true
        tcpdump -r "$pcap" -n -tt 'udp[44:2] = 0x0014' 2>/dev/null | sed 's/^/U /' || true
    } | LC_ALL=C sort -k2,2 -g >"$OUT/setup-$key.frames"
    # "M TS IP SRC > DST: ICMP echo reply ...": a reply to the client's guest starts a
    # pair; "Q|U TS IP SRC.PORT > DST.4791: UDP ...": its first REQ, then its RTU.
    ms="$(awk -v g="$cip" '$1 == "M" { d = $6; sub(/:$/, "", d); if (d == g) armed = 0; next }
        { s = $4; sub(/\.[0-9]+$/, "", s); if (s != g) next }
        $1 == "Q" && !armed { t = $2; armed = 1; next }
        $1 == "U" && armed { printf "%.2f\n", ($2 - t) * 1000; armed = 0 }' "$OUT/setup-$key.frames")"
    got="$(printf '%s\n' $ms | grep -c . || true)"
    med="$(printf '%s\n' $ms | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')"
    echo "  setup $key ($client client -> $server server): REQ to RTU on the bridge, ms (median ${med:-n/a} of $got): $(echo $ms)"
    check "setup $key: $n clients exited 0" eq "$(grep -c '^exit=0' "$OUT/setup-$key.txt")" "$n"
    check "setup $key: a REQ and an RTU after every start mark ($got of $n)" eq "$got" "$n"
    FIG[setup_${key}_ms]="$med"
}

scenario_ibcm-ibcm() {
    # ibcm on both guests: the whole stack on each side, the QPs compared field by field.
    next_port
    bg B srv "ibcm rping -I $B_IP -p $RDMA_PORT -S $SIZE --responder-resources 4 --initiator-depth 2 --wait 60"
    wait_listening B srv || fail "ibcm server on B did not listen"
    guest A 120 "timeout 100 ibcm rping -I $A_IP -a $B_IP -p $RDMA_PORT -C $PINGS -S $SIZE --responder-resources 3 --initiator-depth 4 --hold 1; echo exit=\$?" >"$OUT/ibcm-ibcm.A.txt" 2>&1 || true
    bg_wait B srv "$OUT/ibcm-ibcm.B.txt"
    check "A: $PINGS/$PINGS pings verified" eq "$(pings "$OUT/ibcm-ibcm.A.txt")" "$PINGS/$PINGS"
    check "B: $PINGS/$PINGS RDMA READs verified" eq "$(pings "$OUT/ibcm-ibcm.B.txt")" "$PINGS/$PINGS"
    check "A exited 0" has "$OUT/ibcm-ibcm.A.txt" "exit=0"
    check "B exited 0" has "$OUT/ibcm-ibcm.B.txt" "exit=0"
    qp_pair ibcm-ibcm "$OUT/ibcm-ibcm.A.txt" "$OUT/ibcm-ibcm.B.txt"
    # A asks initiator depth 4 and offers 3 responder resources; B offers 4 and asks 2:
    # A issues up to 4 reads (B serves 4), B issues up to 2 (A serves 2).
    check "read limits: A 4 out / 2 in, asymmetric" eq "$(kv "$OUT/ibcm-ibcm.A.txt" qp-ours max_rd_atomic)/$(kv "$OUT/ibcm-ibcm.A.txt" qp-ours max_dest_rd_atomic)" 4/2
    FIG[ibcm_ibcm_setup_ms]="$(sed -n 's/^rc: established in \([0-9.]*\) ms.*/\1/p' "$OUT/ibcm-ibcm.A.txt" | head -1)"
    setup_frames ibcm_ibcm ibcm ibcm "$SETUP_PAIRS"
}

scenario_ibcm-ibcm-bw() {
    next_port
    # B holds a second before its first SEND (its buffer's advertisement): A reads its QP
    # in that quiet second, B after it, before anything has moved.
    bg B bw "ibcm rc-bw --bind $B_IP -p $RDMA_PORT -S 65536 --depth 8 --responder-resources 8 --initiator-depth 8 --hold 1 --wait 90"
    wait_listening B bw || fail "ibcm bw server on B did not listen"
    guest A 150 "timeout 140 ibcm rc-bw --bind $A_IP --server $B_IP -p $RDMA_PORT -S 65536 -n 100 --depth 8 --responder-resources 8 --initiator-depth 8; echo exit=\$?" >"$OUT/ibcm-ibcm-bw.A.txt" 2>&1 || true
    bg_wait B bw "$OUT/ibcm-ibcm-bw.B.txt"
    check "A: RDMA READs verified" has "$OUT/ibcm-ibcm-bw.A.txt" "bw: RDMA READ 100 x 65536 B verified"
    check "B: SENDs verified" has "$OUT/ibcm-ibcm-bw.B.txt" "bw: received 100 SENDs x 65536 B, every byte verified"
    check "A exited 0" has "$OUT/ibcm-ibcm-bw.A.txt" "exit=0"
    check "B exited 0" has "$OUT/ibcm-ibcm-bw.B.txt" "exit=0"
    qp_pair ibcm-ibcm-bw "$OUT/ibcm-ibcm-bw.A.txt" "$OUT/ibcm-ibcm-bw.B.txt"
    FIG[ibcm_read_mbps]="$(sed -n 's/^bw: RDMA READ .*: \([0-9.]*\) MB\/s/\1/p' "$OUT/ibcm-ibcm-bw.A.txt")"
    FIG[ibcm_send_mbps]="$(sed -n 's/^bw: SEND .*: \([0-9.]*\) MB\/s/\1/p' "$OUT/ibcm-ibcm-bw.A.txt")"
}

linux_cm_on() { # linux_cm_on NAME: the kernel's CM on guest NAME (from here on)
    guest "$1" 30 "load_skipped && lsmod | grep -c '^rdma_cm\|^ib_cm'" >/dev/null || die "loading the kernel CM on guest $1 failed"
}

scenario_linux-server() {
    # ibcm is the client; Linux `rping -s -v -V` serves: it RDMA READs our buffer and
    # writes it back, we compare.
    next_port
    qp_snapshots B ls
    obs_reset
    bg B rping "$OBS rping -s -a $B_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE"
    sleep 1
    guest A 120 "timeout 100 ibcm rping -I $A_IP -a $B_IP -p $RDMA_PORT -C $PINGS -S $SIZE --responder-resources 4 --initiator-depth 2 --hold 2; echo exit=\$?" >"$OUT/linux-server.ibcm.txt" 2>&1 || true
    bg_wait B rping "$OUT/linux-server.linux.txt"
    qp_snapshots_get B ls "$OUT/linux-server.qp.txt"
    check "ibcm: $PINGS/$PINGS pings verified" eq "$(pings "$OUT/linux-server.ibcm.txt")" "$PINGS/$PINGS"
    check "ibcm exited 0" has "$OUT/linux-server.ibcm.txt" "exit=0"
    check "Linux read $PINGS pings" eq "$(grep -c '^server ping data: rdma-ping-' "$OUT/linux-server.linux.txt")" "$PINGS"
    qp_linux "$OUT/linux-server.ibcm.txt" "$OUT/linux-server.qp.txt"
    obs_get "$OUT/linux-server.obs.txt"
    qp_observed "$OUT/linux-server.ibcm.txt" "$OUT/linux-server.obs.txt" quiet
    local rd dr
    rd="$(kv "$OUT/linux-server.ibcm.txt" qp-ours max_rd_atomic)"; dr="$(kv "$OUT/linux-server.ibcm.txt" qp-ours max_dest_rd_atomic)"
    check "read limits: 1 <= our initiator depth ($rd) <= 2 asked" eval "[ '$rd' -ge 1 ] && [ '$rd' -le 2 ]"
    check "read limits: 1 <= our responder resources ($dr) <= 4 offered" eval "[ '$dr' -ge 1 ] && [ '$dr' -le 4 ]"
    FIG[ibcm_linux_setup_ms]="$(sed -n 's/^rc: established in \([0-9.]*\) ms.*/\1/p' "$OUT/linux-server.ibcm.txt" | head -1)"
    # Timing: ibcm's client against Linux rping -s again, without the hold (compared with
    # Linux's client in the baseline).
    next_port
    bg B rping "rping -s -a $B_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE"
    sleep 1
    guest A 120 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 100 ibcm rping -I $A_IP -a $B_IP -p $RDMA_PORT -C $PINGS -S $SIZE > /tmp/ls.log 2>&1; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime); grep '^rping:' /tmp/ls.log" >"$OUT/linux-server.timing.txt" 2>&1 || true
    bg_wait B rping "$OUT/linux-server.linux2.txt"
    check "timing run: $PINGS/$PINGS pings verified" eq "$(pings "$OUT/linux-server.timing.txt")" "$PINGS/$PINGS"
    local ms
    ms="$(uptime_ms "$OUT/linux-server.timing.txt")"
    [ -n "$ms" ] && FIG[ibcm_to_linux_rping_ms]="$ms"
    # Process start to first REQ: ibcm's rping client and Linux rping's, in turn.
    next_port
    first_req 10
    setup_frames ibcm_linux ibcm linux "$SETUP_PAIRS"
}

scenario_linux-client() {
    # ibcm serves; Linux `rping -c -v -V` is the client and validates what we wrote back.
    next_port
    bg A srv "ibcm rping -I $A_IP -p $RDMA_PORT -S $SIZE --responder-resources 2 --initiator-depth 4 --hold 2 --wait 60"
    wait_listening A srv || fail "ibcm server on A did not listen"
    qp_snapshots B lc
    obs_reset
    guest B 120 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 100 $OBS rping -c -a $A_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/linux-client.linux.txt" 2>&1 || true
    bg_wait A srv "$OUT/linux-client.ibcm.txt"
    qp_snapshots_get B lc "$OUT/linux-client.qp.txt"
    # rping exits 0 even when a ping fails (rping.c returns the DISCONNECTED state's 0):
    # the count of validated pings is the check.
    check "Linux verified $PINGS pings" eq "$(grep -c '^ping data: rdma-ping-' "$OUT/linux-client.linux.txt")" "$PINGS"
    check "ibcm: $PINGS/$PINGS RDMA READs verified" eq "$(pings "$OUT/linux-client.ibcm.txt")" "$PINGS/$PINGS"
    check "ibcm: the peer's DREQ answered" has "$OUT/linux-client.ibcm.txt" "rc: disconnected"
    check "ibcm exited 0" has "$OUT/linux-client.ibcm.txt" "exit=0"
    qp_linux "$OUT/linux-client.ibcm.txt" "$OUT/linux-client.qp.txt"
    obs_get "$OUT/linux-client.obs.txt"
    qp_observed "$OUT/linux-client.ibcm.txt" "$OUT/linux-client.obs.txt"
    # Timing: the same Linux client against ibcm again, without the hold (compared with
    # Linux against Linux in the baseline).
    next_port
    bg A srv "ibcm rping -I $A_IP -p $RDMA_PORT -S $SIZE --wait 60"
    wait_listening A srv || fail "ibcm server on A did not listen"
    guest B 120 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 100 rping -c -a $A_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE > /tmp/lc.log 2>&1; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime); echo verified=\$(grep -c '^ping data: rdma-ping-' /tmp/lc.log)" >"$OUT/linux-client.timing.txt" 2>&1 || true
    bg_wait A srv "$OUT/linux-client.ibcm2.txt"
    check "timing run: Linux verified $PINGS pings" has "$OUT/linux-client.timing.txt" "verified=$PINGS"
    local ms
    ms="$(uptime_ms "$OUT/linux-client.timing.txt")"
    [ -n "$ms" ] && FIG[linux_to_ibcm_rping_ms]="$ms"
    setup_frames linux_ibcm linux ibcm "$SETUP_PAIRS"
}

# ucmatose's message count: more than a 16-deep queue holds (cmatose.c sizes its queues to
# -C; ibcm used to post -C receives on 16 and fail with ENOMEM past it).
UC_COUNT=50
# ucmatose -c: the issue's example.
UC_MANY=20

scenario_ucmatose-server() {
    # Linux `ucmatose` serves, ibcm connects: UC_COUNT messages of 100 bytes each way, then
    # both sides disconnect (their DREQs may cross).
    next_port
    obs_reset
    bg B uc "$OBS ucmatose -b $B_IP -p $RDMA_PORT -C $UC_COUNT -S 100"
    sleep 1
    guest A 90 "timeout 80 ibcm ucmatose --bind $A_IP --server $B_IP -p $RDMA_PORT -C $UC_COUNT -S 100; echo exit=\$?" >"$OUT/ucmatose-server.ibcm.txt" 2>&1 || true
    bg_wait B uc "$OUT/ucmatose-server.linux.txt"
    check "ibcm: $UC_COUNT sends and $UC_COUNT receives" has "$OUT/ucmatose-server.ibcm.txt" "ucmatose: $UC_COUNT sends and $UC_COUNT receives of 100 bytes"
    check "ibcm exited 0" has "$OUT/ucmatose-server.ibcm.txt" "exit=0"
    check "Linux: data transfers complete" has "$OUT/ucmatose-server.linux.txt" "data transfers complete"
    check "Linux exited 0" has "$OUT/ucmatose-server.linux.txt" "exit=0"
    obs_get "$OUT/ucmatose-server.obs.txt"
    qp_observed "$OUT/ucmatose-server.ibcm.txt" "$OUT/ucmatose-server.obs.txt" "$UC_COUNT"
}

scenario_ucmatose-client() {
    next_port
    bg A uc "ibcm ucmatose --bind $A_IP -p $RDMA_PORT -C $UC_COUNT -S 100 --wait 60"
    wait_listening A uc || fail "ibcm ucmatose on A did not listen"
    obs_reset
    guest B 90 "timeout 80 $OBS ucmatose -s $A_IP -p $RDMA_PORT -C $UC_COUNT -S 100; echo exit=\$?" >"$OUT/ucmatose-client.linux.txt" 2>&1 || true
    bg_wait A uc "$OUT/ucmatose-client.ibcm.txt"
    check "ibcm: $UC_COUNT sends and $UC_COUNT receives" has "$OUT/ucmatose-client.ibcm.txt" "ucmatose: $UC_COUNT sends and $UC_COUNT receives of 100 bytes"
    check "ibcm exited 0" has "$OUT/ucmatose-client.ibcm.txt" "exit=0"
    check "Linux: data transfers complete" has "$OUT/ucmatose-client.linux.txt" "data transfers complete"
    check "Linux exited 0" has "$OUT/ucmatose-client.linux.txt" "exit=0"
    obs_get "$OUT/ucmatose-client.obs.txt"
    qp_observed "$OUT/ucmatose-client.ibcm.txt" "$OUT/ucmatose-client.obs.txt" "$UC_COUNT"
}

# udaddy's datagrams: more than one, of a size between the GRH's 40 bytes and the 1024-byte
# MTU (the echo check compares the reply's header and the message after it). udaddy's port
# is fixed (udaddy.c: 7174; its -p is the port space).
UD_COUNT=50
UD_SIZE=500

scenario_udaddy-ibcm() {
    # ibcm on both guests: ibcm's udaddy server answers ibcm's client, whose checks are
    # strict (every reply the echo of its own datagram, from the SIDR_REP's QPN, with its
    # GRH and immediate data), where Linux's udaddy client counts completions only.
    bg B ud "ibcm udaddy --bind $B_IP -C $UD_COUNT -S $UD_SIZE --wait 60"
    wait_listening B ud || fail "ibcm udaddy on B did not listen"
    guest A 70 "timeout 60 ibcm udaddy --bind $A_IP --server $B_IP -C $UD_COUNT -S $UD_SIZE --wait 30; echo exit=\$?" >"$OUT/udaddy-ibcm.A.txt" 2>&1 || true
    bg_wait B ud "$OUT/udaddy-ibcm.B.txt"
    check "client: SIDR_REP with rdma_cm's Q_Key" has "$OUT/udaddy-ibcm.A.txt" "Q_Key 0x01234567"
    check "client: $UD_COUNT sends and $UD_COUNT checked replies" has "$OUT/udaddy-ibcm.A.txt" "udaddy: $UD_COUNT sends and $UD_COUNT receives of $UD_SIZE bytes"
    check "server: $UD_COUNT datagrams in, $UD_COUNT replies out" has "$OUT/udaddy-ibcm.B.txt" "udaddy: $UD_COUNT sends and $UD_COUNT receives of $UD_SIZE bytes"
    check "client exited 0" has "$OUT/udaddy-ibcm.A.txt" "exit=0"
    check "server exited 0" has "$OUT/udaddy-ibcm.B.txt" "exit=0"
}

scenario_udaddy-server() {
    # Linux `udaddy` serves, ibcm resolves it with SIDR and sends; Linux answers each.
    bg B ud "udaddy -b $B_IP -C $UD_COUNT -S $UD_SIZE"
    # udaddy's own "starting server" line is buffered until it exits: its listen is seen
    # in the kernel's CM ids instead (udaddy.c's port, 7174).
    guest B 20 "i=0; until rdma resource show cm_id 2>/dev/null | grep LISTEN | grep -q ':7174'; do [ \$i -ge 100 ] && exit 1; sleep 0.1; i=\$((i+1)); done" >/dev/null 2>&1 || fail "Linux udaddy on B did not listen"
    guest A 70 "timeout 60 ibcm udaddy --bind $A_IP --server $B_IP -C $UD_COUNT -S $UD_SIZE --wait 30; echo exit=\$?" >"$OUT/udaddy-server.ibcm.txt" 2>&1 || true
    bg_wait B ud "$OUT/udaddy-server.linux.txt"
    check "ibcm: SIDR_REP with rdma_cm's Q_Key" has "$OUT/udaddy-server.ibcm.txt" "Q_Key 0x01234567"
    check "ibcm: $UD_COUNT sends and $UD_COUNT checked replies" has "$OUT/udaddy-server.ibcm.txt" "udaddy: $UD_COUNT sends and $UD_COUNT receives of $UD_SIZE bytes"
    check "ibcm exited 0" has "$OUT/udaddy-server.ibcm.txt" "exit=0"
    check "Linux: data transfers complete" has "$OUT/udaddy-server.linux.txt" "data transfers complete"
    check "Linux: return status 0" has "$OUT/udaddy-server.linux.txt" "return status 0"
    check "Linux exited 0" has "$OUT/udaddy-server.linux.txt" "exit=0"
}

scenario_udaddy-client() {
    # ibcm serves udaddy's UDP port, Linux `udaddy -s` resolves it with SIDR and sends.
    bg A ud "ibcm udaddy --bind $A_IP -C $UD_COUNT -S $UD_SIZE --wait 60"
    wait_listening A ud || fail "ibcm udaddy on A did not listen"
    guest B 70 "timeout 60 udaddy -s $A_IP -b $B_IP -C $UD_COUNT -S $UD_SIZE; echo exit=\$?" >"$OUT/udaddy-client.linux.txt" 2>&1 || true
    bg_wait A ud "$OUT/udaddy-client.ibcm.txt"
    check "ibcm: SIDR_REP sent" has "$OUT/udaddy-client.ibcm.txt" "SIDR_REP sent"
    check "ibcm: $UD_COUNT datagrams in, $UD_COUNT replies out" has "$OUT/udaddy-client.ibcm.txt" "udaddy: $UD_COUNT sends and $UD_COUNT receives of $UD_SIZE bytes"
    check "ibcm exited 0" has "$OUT/udaddy-client.ibcm.txt" "exit=0"
    check "Linux: no error event" eval "! grep -q 'event: ' '$OUT/udaddy-client.linux.txt'"
    check "Linux: data transfers complete" has "$OUT/udaddy-client.linux.txt" "data transfers complete"
    check "Linux: return status 0" has "$OUT/udaddy-client.linux.txt" "return status 0"
    check "Linux exited 0" has "$OUT/udaddy-client.linux.txt" "exit=0"
}

# perftest over rdma_cm (-R) against ibcm's `perftest` command: PT_ITERS messages of
# PT_SIZE bytes, the sizes of the Linux-Linux baseline. -F: perftest does not stop on the
# guest's unknown CPU frequency.
PT_SIZE=65536
PT_ITERS=100
# pt_row FILE: perftest's result row "#bytes #iterations BW peak BW average MsgRate".
pt_row() { awk -v s="${3:-$PT_SIZE}" -v n="${2:-$PT_ITERS}" '$1==s && $2==n {print; exit}' "$1"; }
scenario_perftest-server() {
    # ibcm serves, Linux perftest connects. RDMA READ with asymmetric limits: perftest -o 8
    # asks 8 and offers 8 (pc.c:2290-2293); ibcm offers 2 responder resources and asks 4:
    # its REP carries min(2, 8) = 2 and min(4, 8) = 4 (IBA 12.7.29-30), so ibcm's QP issues
    # 4 and serves 2, Linux's (its CM crosses the REP) issues 2 and serves 4. Powers of two:
    # rxe rounds both limits up to one (rxe_qp.c rxe_qp_from_attr, roundup_pow_of_two).
    # send-small: 1 KiB messages, at most half the agreed cycle buffer (4096, the larger
    # page size, pc.c:1838): perftest sends each from another place of its random buffer
    # (pr.c:3190-3191), so ibcm checks their length only and says so.
    local t run sz
    for run in read send send-small; do
        t="${run%%-*}"
        sz="$PT_SIZE"
        [ "$run" = send-small ] && sz=1024
        next_port
        local lim="--responder-resources 2 --initiator-depth 4"
        local o="-o 8"
        [ "$t" = send ] && { lim=""; o=""; }
        bg A pt "ibcm perftest --test $t --bind $A_IP -p $RDMA_PORT -s $sz -n $PT_ITERS $lim --hold 1 --wait 60"
        wait_listening A pt || fail "ibcm perftest on A did not listen"
        qp_snapshots B ps
        obs_reset
        guest B 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 120 $OBS ib_${t}_bw -R -F -p $RDMA_PORT -s $sz -n $PT_ITERS $o $A_IP; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/perftest-server.$run.linux.txt" 2>&1 || true
        bg_wait A pt "$OUT/perftest-server.$run.ibcm.txt"
        qp_snapshots_get B ps "$OUT/perftest-server.$run.qp.txt"
        local f="$OUT/perftest-server.$run.ibcm.txt" l="$OUT/perftest-server.$run.linux.txt"
        check "ib_${t}_bw exited 0" has "$l" "exit=0"
        check "ib_${t}_bw printed its $sz x $PT_ITERS row" eval "[ -n \"\$(pt_row '$l' $PT_ITERS $sz)\" ]"
        check "ibcm exited 0" has "$f" "exit=0"
        qp_linux "$f" "$OUT/perftest-server.$run.qp.txt"
        obs_get "$OUT/perftest-server.$run.obs.txt"
        qp_observed "$f" "$OUT/perftest-server.$run.obs.txt" quiet
        if [ "$t" = read ]; then
            check "ibcm got the client's report: $PT_ITERS x $PT_SIZE B" has "$f" "perftest: client report: $PT_ITERS x $PT_SIZE B"
            check "read limits: ibcm 4 out / 2 in" eq "$(kv "$f" qp-ours max_rd_atomic)/$(kv "$f" qp-ours max_dest_rd_atomic)" 4/2
            check "read limits: Linux 2 out / 4 in (the REP crossed), observed" eq "$(obs "$OUT/perftest-server.$run.obs.txt" "$(kv "$f" qp-ours dest_qpn)" max_rd_atomic)/$(obs "$OUT/perftest-server.$run.obs.txt" "$(kv "$f" qp-ours dest_qpn)" max_dest_rd_atomic)" 2/4
            FIG[linux_to_ibcm_read_mbps]="$(pt_row "$l" | awk '{print $4}')"
        elif [ "$run" = send-small ]; then
            check "ibcm: $PT_ITERS messages of $sz B received, length checked only (not claimed verified)" has "$f" "perftest: received $PT_ITERS x $sz B length checked only"
        else
            check "ibcm: $PT_ITERS messages received, each as the first" has "$f" "perftest: received $PT_ITERS x $PT_SIZE B verified"
            FIG[linux_to_ibcm_send_mbps]="$(pt_row "$l" | awk '{print $4}')"
        fi
        [ "$run" = send-small ] || FIG[linux_to_ibcm_${t}_wall_ms]="$(uptime_ms "$l")"
    done
}

scenario_perftest-client() {
    # Linux perftest serves, ibcm connects. RDMA READ: ibcm asks 2 and offers 8; perftest
    # -o 4 accepts with 4 and 4 as given (librdmacm cma.c:1918-1928: not bounded by the
    # REQ's 2). ibcm's engine takes both limits from the REP crossed, as cm.c
    # cm_rep_handler does (initiator depth := REP ResponderResources, responder resources
    # := REP InitiatorDepth): its QP issues 4 at once and serves 4, as Linux's. perftest's
    # server listens for the data connection only after the handshake that precedes it
    # (pc.c:2737-2746), so ibcm's first REQ may meet REJ 8 and is retried as perftest's own
    # client retries (pc.c:2684-2707).
    # read-default: perftest's server without -o grants the device's maximum, rxe's 128
    # (pp.c:2014-2030, rxe_param.h RXE_MAX_QP_RD_ATOM), whatever the REQ asked: ibcm's QP
    # gets initiator depth 128 and its READs in flight stay within that and its send queue
    # (300 READs: more than a 64-slot send queue, which rxe rounds to 127, could hold).
    local t run
    for run in read read-default send; do
        t="${run%%-*}"
        next_port
        local lim="--responder-resources 8 --initiator-depth 2"
        local o="-o 4" n="$PT_ITERS"
        [ "$run" = read-default ] && { o=""; n=300; }
        [ "$t" = send ] && { lim=""; o=""; }
        qp_snapshots B pc
        obs_reset
        bg B pt "$OBS ib_${t}_bw -R -F -p $RDMA_PORT -s $PT_SIZE -n $n $o"
        sleep 2
        guest A 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 120 ibcm perftest --test $t --bind $A_IP --server $B_IP -p $RDMA_PORT -s $PT_SIZE -n $n $lim --hold 1 --wait 60; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/perftest-client.$run.ibcm.txt" 2>&1 || true
        bg_wait B pt "$OUT/perftest-client.$run.linux.txt"
        qp_snapshots_get B pc "$OUT/perftest-client.$run.qp.txt"
        local f="$OUT/perftest-client.$run.ibcm.txt" l="$OUT/perftest-client.$run.linux.txt"
        check "ib_${t}_bw (server) exited 0" has "$l" "exit=0"
        check "ibcm exited 0" has "$f" "exit=0"
        qp_linux "$f" "$OUT/perftest-client.$run.qp.txt"
        obs_get "$OUT/perftest-client.$run.obs.txt"
        qp_observed "$f" "$OUT/perftest-client.$run.obs.txt" quiet
        if [ "$run" = read-default ]; then
            check "ibcm: $n RDMA READs verified" has "$f" "perftest: RDMA READ $n x $PT_SIZE B verified"
            check "read limits: ibcm issues up to 128 (perftest's default out_reads on rxe, the REP's)" eq "$(kv "$f" qp-ours max_rd_atomic)" 128
            local fl
            fl="$(sed -n 's/.*at most \([0-9]*\) READs in flight (QP: max_rd_atomic \([0-9]*\), send queue \([0-9]*\)).*/\1 \2 \3/p' "$f")"
            echo "  READs in flight / max_rd_atomic / send queue: ${fl:-none}"
            check "READs in flight within max_rd_atomic and the send queue ($fl)" eval "set -- $fl; [ \$# -eq 3 ] && [ \$1 -ge 1 ] && [ \$1 -le \$2 ] && [ \$1 -le \$3 ]"
            check "ib_read_bw printed ibcm's report row" eval "[ -n \"\$(pt_row '$l' $n)\" ]"
        elif [ "$t" = read ]; then
            check "ibcm: $PT_ITERS RDMA READs verified" has "$f" "perftest: RDMA READ $PT_ITERS x $PT_SIZE B verified"
            check "ibcm issued 4 READs at once, its QP's initiator depth" has "$f" "at most 4 READs in flight"
            check "read limits: ibcm 4 out / 4 in (the REP crossed, not the REQ's 2 / 8)" eq "$(kv "$f" qp-ours max_rd_atomic)/$(kv "$f" qp-ours max_dest_rd_atomic)" 4/4
            check "ib_read_bw printed ibcm's report row" eval "[ -n \"\$(pt_row '$l')\" ]"
            FIG[ibcm_to_linux_read_mbps]="$(sed -n 's/^perftest: RDMA READ .*: \([0-9.]*\) MB\/s.*/\1/p' "$f")"
        else
            check "ibcm: $PT_ITERS SENDs" has "$f" "perftest: SEND $PT_ITERS x $PT_SIZE B completed"
            check "ib_send_bw (server) printed its row" eval "[ -n \"\$(pt_row '$l')\" ]"
            # (ib_send_bw's server prints 0.00 for this run on TCG: ibcm's own figure.)
            FIG[ibcm_to_linux_send_mbps]="$(sed -n 's/^perftest: SEND .*: \([0-9.]*\) MB\/s.*/\1/p' "$f")"
        fi
        [ "$run" = read-default ] || FIG[ibcm_to_linux_${t}_wall_ms]="$(uptime_ms "$f")"
    done
}

# pt_lat FILE: perftest's latency row "#bytes #iterations t_min t_max t_typical t_avg
# t_stdev 99% 99.9%" for PT_LAT_SIZE x PT_LAT_ITERS.
PT_LAT_SIZE=64
PT_LAT_ITERS=200
pt_lat() { awk -v s="$PT_LAT_SIZE" -v n="$PT_LAT_ITERS" '$1==s && $2==n {print; exit}' "$1"; }
# ibcm_lat FILE FIELD: a field (t_typical, t_avg, 99%) of ibcm's "perftest: latency" line.
ibcm_lat() { sed -n "s/^perftest: latency .* $2 \([0-9.]*\).*/\1/p" "$1" | head -1; }

scenario_perftest-write() {
    # ib_write_bw -R: the client RDMA WRITEs the server's buffer (perftest's handshakes as
    # ib_read_bw's, write_bw.c). ibcm as the server checks its buffer was written over after
    # the client's end (perftest writes random bytes, pr.c:1780-1790, from the start of the
    # server's buffer); ibcm as the client has every WRITE acknowledged (perftest grants no
    # READs on a WRITE test, pc.c:2356-2358: nothing to read back).
    next_port
    bg A pt "ibcm perftest --test write --bind $A_IP -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS --wait 60"
    wait_listening A pt || fail "ibcm perftest on A did not listen"
    guest B 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 120 ib_write_bw -R -F -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS $A_IP; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/perftest-write.server.linux.txt" 2>&1 || true
    bg_wait A pt "$OUT/perftest-write.server.ibcm.txt"
    local f="$OUT/perftest-write.server.ibcm.txt" l="$OUT/perftest-write.server.linux.txt"
    check "ib_write_bw (client) exited 0" has "$l" "exit=0"
    check "ib_write_bw printed its row" eval "[ -n \"\$(pt_row '$l')\" ]"
    check "ibcm exited 0" has "$f" "exit=0"
    check "ibcm got the client's report: $PT_ITERS x $PT_SIZE B" has "$f" "perftest: client report: $PT_ITERS x $PT_SIZE B"
    check "ibcm: the client's WRITEs landed in its buffer" has "$f" "perftest: RDMA WRITE landed"
    check "no read limits on a WRITE test's connection (ibcm 0 / 0)" eq "$(kv "$f" qp-ours max_rd_atomic)/$(kv "$f" qp-ours max_dest_rd_atomic)" 0/0
    FIG[linux_to_ibcm_write_mbps]="$(pt_row "$l" | awk '{print $4}')"
    next_port
    bg B pt "ib_write_bw -R -F -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS"
    sleep 2
    guest A 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 120 ibcm perftest --test write --bind $A_IP --server $B_IP -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS --wait 60; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/perftest-write.client.ibcm.txt" 2>&1 || true
    bg_wait B pt "$OUT/perftest-write.client.linux.txt"
    f="$OUT/perftest-write.client.ibcm.txt"; l="$OUT/perftest-write.client.linux.txt"
    check "ib_write_bw (server) exited 0" has "$l" "exit=0"
    check "ib_write_bw (server) printed ibcm's report row" eval "[ -n \"\$(pt_row '$l')\" ]"
    check "ibcm: $PT_ITERS RDMA WRITEs completed" has "$f" "perftest: RDMA WRITE $PT_ITERS x $PT_SIZE B completed"
    check "ibcm exited 0" has "$f" "exit=0"
    FIG[ibcm_to_linux_write_mbps]="$(sed -n 's/^perftest: RDMA WRITE .*: \([0-9.]*\) MB\/s.*/\1/p' "$f")"
}

scenario_perftest-lat() {
    # The latency tests' ping-pongs (read_lat.c, send_lat.c): ibcm in both roles, its own
    # latency line beside perftest's row. ib_read_lat's server prints no figures (it only
    # waits, read_lat.c:245-251).
    local t
    for t in read send; do
        next_port
        bg A pt "ibcm perftest --test $t-lat --bind $A_IP -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS --wait 60"
        wait_listening A pt || fail "ibcm perftest on A did not listen"
        guest B 150 "timeout 120 ib_${t}_lat -R -F -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS $A_IP; echo exit=\$?" >"$OUT/perftest-lat.$t-server.linux.txt" 2>&1 || true
        bg_wait A pt "$OUT/perftest-lat.$t-server.ibcm.txt"
        local f="$OUT/perftest-lat.$t-server.ibcm.txt" l="$OUT/perftest-lat.$t-server.linux.txt"
        check "ib_${t}_lat (client) exited 0" has "$l" "exit=0"
        check "ib_${t}_lat (client) printed its latency row" eval "[ -n \"\$(pt_lat '$l')\" ]"
        check "ibcm ($t-lat server) exited 0" has "$f" "exit=0"
        FIG[linux_to_ibcm_${t}_lat_us]="$(pt_lat "$l" | awk '{print $5}')"
        if [ "$t" = send ]; then
            check "ibcm: $PT_LAT_ITERS ping-pongs, every message verified" has "$f" "perftest: latency $PT_LAT_ITERS x $PT_LAT_SIZE B (SEND ping-pong, every message verified)"
        fi
        next_port
        bg B pt "ib_${t}_lat -R -F -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS"
        sleep 2
        guest A 150 "timeout 120 ibcm perftest --test $t-lat --bind $A_IP --server $B_IP -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS --wait 60; echo exit=\$?" >"$OUT/perftest-lat.$t-client.ibcm.txt" 2>&1 || true
        bg_wait B pt "$OUT/perftest-lat.$t-client.linux.txt"
        f="$OUT/perftest-lat.$t-client.ibcm.txt"; l="$OUT/perftest-lat.$t-client.linux.txt"
        check "ib_${t}_lat (server) exited 0" has "$l" "exit=0"
        check "ibcm ($t-lat client) exited 0" has "$f" "exit=0"
        check "ibcm: its latency line for $PT_LAT_ITERS x $PT_LAT_SIZE B" has "$f" "perftest: latency $PT_LAT_ITERS x $PT_LAT_SIZE B"
        grep '^perftest: latency' "$f" | sed 's/^/  /' || true
        FIG[ibcm_to_linux_${t}_lat_us]="$(ibcm_lat "$f" t_typical)"
    done
}

scenario_perftest-refuse() {
    # A test that is not ibcm's is refused, not served (perftest.rs module docs):
    # 1. ibcm --test read serves, Linux runs ib_write_bw: its REQ carries no read limits
    #    (pc.c:2290-2293). Before the fix this run passed on both sides.
    # 2. ibcm --test write connects to Linux ib_read_bw: its REP grants reads (pc.c:2356-2358).
    # 3. ibcm --test read-lat serves, Linux runs ib_read_bw: the read limits agree, the
    #    exchanges do not (read_lat has four handshakes and no report): the client's 8-byte
    #    report value comes where ib_read_lat's close handshake is due.
    # Linux's perftest does not watch its CM events: after ibcm's DREQs it waits in its
    # control receive until it is killed (exit 143), which counts as not passing. It is
    # killed as soon as ibcm has refused, not at its timeout: its process's end destroys
    # its CM IDs, whose DREPs (cm.c cm_destroy_id, IB_CM_DREQ_RCVD) end ibcm's
    # disconnects, which otherwise wait out their DREQs' retries (20 s of each run).
    local run f l peer
    for run in read-vs-write_bw write-vs-read_bw read-lat-vs-read_bw; do
        next_port
        f="$OUT/perftest-refuse.$run.ibcm.txt"; l="$OUT/perftest-refuse.$run.linux.txt"
        case "$run" in
            read-vs-write_bw | read-lat-vs-read_bw)
                local t=read
                peer=ib_write_bw
                [ "$run" = read-lat-vs-read_bw ] && { t=read-lat; peer=ib_read_bw; }
                bg A pt "ibcm perftest --test $t --bind $A_IP -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS --wait 30"
                wait_listening A pt || fail "ibcm perftest on A did not listen"
                guest B 10 "(timeout 40 $peer -R -F -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS $A_IP; echo exit=\$?) > /tmp/pt.log 2>&1 &" >/dev/null
                ;;
            write-vs-read_bw)
                peer=ib_read_bw
                guest B 10 "(timeout 40 $peer -R -F -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS; echo exit=\$?) > /tmp/pt.log 2>&1 &" >/dev/null
                sleep 2
                bg A pt "ibcm perftest --test write --bind $A_IP --server $B_IP -p $RDMA_PORT -s $PT_SIZE -n $PT_ITERS --wait 30"
                ;;
        esac
        # Until ibcm has said what it found (or ended), 30 s at most; then Linux's
        # perftest is stopped and its exit status waited for, then ibcm's end.
        guest A 40 "i=0; until grep -q '^perftest: \(REFUSED\|FAILED\)\|^exit=' /tmp/pt.log 2>/dev/null || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i+1)); done" >/dev/null 2>&1 || true
        guest B 40 "killall $peer 2>/dev/null; i=0; until grep -q '^exit=' /tmp/pt.log || [ \$i -ge 250 ]; do sleep 0.1; i=\$((i+1)); done; cat /tmp/pt.log" >"$l" 2>&1 || true
        cm_pad B
        bg_wait A pt "$f"
        grep '^perftest: REFUSED' "$f" | sed 's/^/  /' || true
        check "$run: ibcm refused the peer's test" has "$f" "perftest: REFUSED: the peer does not run"
        # The whole line: `timeout` kills with exit=124 (coreutils) or 143 (busybox), both
        # of which hold "exit=1".
        check "$run: ibcm exited 1 (not 0, not killed by its timeout)" has "$f" "^exit=1$"
        # A read server's run line is its client's report; a read-lat server prints none,
        # so a served read-lat run shows only as exit=0.
        check "$run: ibcm did not report a run" eval "! grep -q '^perftest: \(RDMA\|SEND\|received\|latency\|client report\)' '$f'"
        check "$run: Linux's perftest did not pass either" eval "grep -q 'exit=' '$l' && ! grep -q 'exit=0' '$l'"
    done
}

scenario_ucmatose-many() {
    # cmatose.c -c: UC_MANY connections in one process, each exchanging UC_COUNT messages
    # each way once all are established (run_server, run_client), in both roles.
    next_port
    # rxe's counters on both guests around the client role: packets lost on the emulated
    # link show as A's completer retries (rxe_comp.c RXE_CNT_COMP_RETRY) and B's duplicate
    # requests.
    local g rxe="$OUT/ucmatose-many.client.rxe.txt"
    for g in A B; do echo "before $g: $(guest "$g" 10 "rdma statistic show link rxe0/1" 2>&1)"; done >"$rxe"
    bg B uc "ucmatose -b $B_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100"
    sleep 1
    guest A 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 140 ibcm ucmatose --bind $A_IP --server $B_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100 --wait 60; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/ucmatose-many.client.ibcm.txt" 2>&1 || true
    bg_wait B uc "$OUT/ucmatose-many.client.linux.txt"
    for g in A B; do echo "after $g: $(guest "$g" 10 "rdma statistic show link rxe0/1" 2>&1)"; done >>"$rxe"
    local f="$OUT/ucmatose-many.client.ibcm.txt" l="$OUT/ucmatose-many.client.linux.txt"
    check "ibcm client: $UC_MANY of $UC_MANY connections exchanged and disconnected" has "$f" "ucmatose: $UC_MANY of $UC_MANY connections exchanged $UC_COUNT messages each way and disconnected"
    check "ibcm client: $UC_MANY lines of $UC_COUNT sends and receives" eval "[ \$(grep -c ': $UC_COUNT sends and $UC_COUNT receives of 100 bytes' '$f') -eq $UC_MANY ]"
    check "ibcm client exited 0" has "$f" "exit=0"
    check "Linux server: data transfers complete" has "$l" "data transfers complete"
    check "Linux server exited 0" has "$l" "exit=0"
    FIG[ibcm_to_linux_ucmatose_many_ms]="$(uptime_ms "$f")"
    next_port
    bg A uc "ibcm ucmatose --bind $A_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100 --wait 60"
    wait_listening A uc || fail "ibcm ucmatose on A did not listen"
    guest B 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 140 ucmatose -s $A_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/ucmatose-many.server.linux.txt" 2>&1 || true
    bg_wait A uc "$OUT/ucmatose-many.server.ibcm.txt"
    f="$OUT/ucmatose-many.server.ibcm.txt"; l="$OUT/ucmatose-many.server.linux.txt"
    check "ibcm server: $UC_MANY of $UC_MANY connections exchanged and disconnected" has "$f" "ucmatose: $UC_MANY of $UC_MANY connections exchanged $UC_COUNT messages each way and disconnected"
    check "ibcm server exited 0" has "$f" "exit=0"
    check "Linux client: data transfers complete" has "$l" "data transfers complete"
    check "Linux client exited 0" has "$l" "exit=0"
    FIG[linux_to_ibcm_ucmatose_many_ms]="$(uptime_ms "$l")"
}

scenario_port-down() {
    # ibcm's guest loses its link mid-transfer: ibcm pings a persistent Linux rping server
    # (-P: each connection its own thread) without end; A's eth0 goes down for 5 s. rxe
    # raises IBV_EVENT_PORT_ERR (rxe_net.c rxe_port_down), driver/linux port_events.rs tells
    # the engine Device::port_down (the KMDF binding's IB_PNP_PORT_DOWN). What must hold
    # whichever way the engine times the end (at once, or once the QP's retries would have
    # run out): the application gets one CM event ending the connection within its wait;
    # the QP's own transport ends the work in flight with its error (a probe SEND posted
    # after PORT_ERR, the QP left alone for its retry time, 4.096 us x 2^16 x 8 = 2.1 s
    # < 5 s down), not a flush ibcm caused; the engine holds nothing once the connection
    # is destroyed (its timewait over); PORT_ACTIVE comes back and a new QP
    # connects and verifies 10 pings; Linux's side of the old connection ends; no panic.
    next_port
    guest B 10 "rping -s -P -a $B_IP -p $RDMA_PORT -V -S 4096 > /tmp/rp.log 2>&1 & echo \$! > /tmp/rp.pid" >/dev/null
    sleep 1
    bg A pf "ibcm port-fault -I $A_IP -a $B_IP -p $RDMA_PORT -C 10 -S 4096 --wait 60"
    guest A 60 "i=0; until grep -q '^ping data' /tmp/pf.log 2>/dev/null || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i+1)); done; sleep 2; ip link set eth0 down; echo link down; sleep 5; ip link set eth0 up; echo link up" >"$OUT/port-down.link.txt" 2>&1 || true
    bg_wait A pf "$OUT/port-down.ibcm.txt"
    # rping prints "server DISCONNECT EVENT..." (rping.c:223-226, rdma-core v44.0) or "cq
    # completion failed status N" (rping.c:297-300) when its connection ends.
    guest B 90 "i=0; until grep -q 'DISCONNECT EVENT\|cq completion failed' /tmp/rp.log || [ \$i -ge 200 ]; do sleep 0.1; i=\$((i+1)); done; kill \$(cat /tmp/rp.pid); echo rping-log:; cat /tmp/rp.log" >"$OUT/port-down.linux.txt" 2>&1 || true
    local f="$OUT/port-down.ibcm.txt"
    grep '^rc: CM event\|^fault: \(CM event\|QP state\|pings ended\|probe\)' "$f" | sed 's/^/  /'
    check "the link went down and up" has "$OUT/port-down.link.txt" "link up"
    check "ibcm: PORT_ERR and PORT_ACTIVE told to the engine" eval "grep -q '^fault: port events: PORT_ERR [1-9][0-9]*, PORT_ACTIVE [1-9]' '$f'"
    check "ibcm: a probe SEND was in flight when the link went down" has "$f" "probe SEND posted after PORT_ERR: true"
    check "ibcm: one CM event ended the connection, within the wait" eval "grep -q '^rc: CM event: ' '$f' && ! grep -q '^rc: CM event: .*CANCELLED' '$f' && grep -q '^fault: CM event [0-9]* ms after PORT_ERR' '$f'"
    # rxe does not retry into a link that is down: the first packet it cannot build (no
    # route, no GID: rxe_req.c rxe_requester, init_req_packet failing) completes the WQE
    # with IB_WC_LOC_QP_OP_ERR (2) and the QP goes to ERR on its own (seen: the QP in
    # state 6 when the CM event came, before ibcm touched it). A flush (5) would be ibcm's
    # own doing, success the probe reaching a peer it cannot reach.
    # Or, seen as well: rxe still holds the probe (the QP in RTS) when the engine's
    # deadline for the connection, the QP's own give-up time, has passed: then the CM
    # event must not have come before that time (the engine waited out the QP's retries,
    # driver/cep/src/manager/link.rs), and the work ends in the flush that follows it.
    local st give_up at
    st="$(sed -n 's/^fault: pings ended: .*completion .*(\([0-9]*\))$/\1/p' "$f" | head -1)"
    give_up="$(sed -n 's/^fault: probe SEND posted after PORT_ERR: true; transport give-up time \([0-9]*\) ms.*/\1/p' "$f" | head -1)"
    at="$(sed -n 's/^fault: CM event \([0-9]*\) ms after PORT_ERR$/\1/p' "$f" | head -1)"
    check "ibcm: the QP's transport ended the work in flight with its own error (status ${st:-none}), or the CM event (${at:-?} ms) waited for the QP's give-up time (${give_up:-?} ms) while it still retried" eval "{ [ -n '$st' ] && [ '$st' != 0 ] && [ '$st' != 5 ]; } || { [ -n '$at' ] && [ -n '$give_up' ] && [ '$at' -ge \$(( ${give_up:-0} * 9 / 10 )) ] && grep -q '^fault: QP state at the CM event (before ibcm moved it): 3' '$f'; }"
    check "ibcm: nothing held after the faulted connection is destroyed" has "$f" "fault: engine after the connection is destroyed: live_ceps=0 "
    check "ibcm: 10/10 pings verified after the reconnect (a new QP)" has "$f" "rping: 10/10 pings verified after the reconnect"
    check "ibcm: nothing held at the end" has "$f" "fault: engine at the end: live_ceps=0 "
    check "ibcm exited 0, no panic" eval "grep -q 'exit=0' '$f' && ! grep -qi 'panick' '$f'"
    check "Linux: the old connection ended (rping's DISCONNECT EVENT or a failed completion)" awk '/^rping-log:/ { f = 1 } f && /DISCONNECT EVENT|cq completion failed/ { m = 1 } END { exit !m }' "$OUT/port-down.linux.txt"
}

scenario_port-flap() {
    # A short flap: ibcm pings a Linux `rping -s -P` 10 times, then leaves the connection
    # idle while A's eth0 goes down for 0.3 s and up, then pings 10 more times on the same
    # connection. rxe sends nothing for an idle RC QP (only posted work or a retransmission
    # makes a packet), so the transport survives; the connection survives because the
    # engine ends a connection only once its retries would have run out with the port
    # still down (driver/cep/src/manager/link.rs), not at once.
    next_port
    guest B 10 "rping -s -P -a $B_IP -p $RDMA_PORT -V -S 4096 > /tmp/rf.log 2>&1 & echo \$! > /tmp/rf.pid" >/dev/null
    sleep 1
    bg A pff "ibcm port-fault --flap -I $A_IP -a $B_IP -p $RDMA_PORT -C 10 -S 4096 --wait 60"
    guest A 60 "i=0; until grep -q '^flap: idle' /tmp/pff.log 2>/dev/null || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i+1)); done; ip link set eth0 down; echo link down; sleep 0.3; ip link set eth0 up; echo link up" >"$OUT/port-flap.link.txt" 2>&1 || true
    bg_wait A pff "$OUT/port-flap.ibcm.txt"
    guest B 10 "kill \$(cat /tmp/rf.pid)" >/dev/null 2>&1 || true
    guest B 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true
    local f="$OUT/port-flap.ibcm.txt"
    grep '^flap: \|^rping: \|^fault: port events' "$f" | sed 's/^/  /'
    check "the link went down and up" has "$OUT/port-flap.link.txt" "link up"
    check "ibcm: 10/10 pings verified before the flap" has "$f" "rping: 10/10 pings verified before the flap"
    check "ibcm: PORT_ERR and PORT_ACTIVE seen" eval "grep -q '^fault: port events: PORT_ERR [1-9][0-9]*, PORT_ACTIVE [1-9]' '$f'"
    check "ibcm: no CM event ended the connection" has "$f" "flap: no CM event: the connection survived"
    check "ibcm: 10/10 pings verified after the flap, same connection" has "$f" "rping: 10/10 pings verified after the flap"
    check "ibcm: nothing held at the end" has "$f" "fault: engine at the end: live_ceps=0 "
    check "ibcm exited 0, no panic" eval "grep -q 'exit=0' '$f' && ! grep -qi 'panick' '$f'"
}

scenario_reject-linux() {
    # ibcm connects to a port nobody listens on: Linux's CM rejects (reason 8).
    guest A 60 "timeout 50 ibcm rping -I $A_IP -a $B_IP -p 7999 -C 1 --wait 30; echo exit=\$?" >"$OUT/reject-linux.ibcm.txt" 2>&1 || true
    check "ibcm reports the REJ" eval "grep -qi 'rejected' '$OUT/reject-linux.ibcm.txt'"
    check "ibcm exited non-zero" eval "! grep -q 'exit=0' '$OUT/reject-linux.ibcm.txt'"
}

scenario_reject-ibcm() {
    # Linux connects to a port ibcm does not serve: ibcm's CM rejects, rping sees it.
    next_port
    bg A srv "ibcm rping -I $A_IP -p $RDMA_PORT -S $SIZE --wait 8"
    wait_listening A srv || fail "ibcm server on A did not listen"
    guest B 60 "timeout 50 rping -c -a $A_IP -p 7998 -C 1 -v; echo exit=\$?" >"$OUT/reject-ibcm.linux.txt" 2>&1 || true
    bg_wait A srv "$OUT/reject-ibcm.ibcm.txt"
    check "rping saw RDMA_CM_EVENT_REJECTED" has "$OUT/reject-ibcm.linux.txt" "RDMA_CM_EVENT_REJECTED"
    check "rping exited non-zero" eval "! grep -q 'exit=0' '$OUT/reject-ibcm.linux.txt'"
}

scenario_req-timeout() {
    # Nobody answers at $DEAD_IP: the REQ is retried 2 times, then the connect times out.
    local t0 t1
    t0=$(date +%s)
    guest A 90 "timeout 80 ibcm rping -I $A_IP -a $DEAD_IP -p 7471 -C 1 --max-cm-retries 2 --wait 60; echo exit=\$?" >"$OUT/req-timeout.ibcm.txt" 2>&1 || true
    t1=$(date +%s)
    check "ibcm reports the REQ unanswered" has "$OUT/req-timeout.ibcm.txt" "no answer to the Req"
    check "ibcm exited non-zero (not killed by timeout 80)" eval "grep -q 'exit=' '$OUT/req-timeout.ibcm.txt' && ! grep -q 'exit=0\|exit=124' '$OUT/req-timeout.ibcm.txt'"
    echo "  REQ timeout after $((t1 - t0)) s"
}

scenario_disconnect-in-flight() {
    # Linux `rping -c` pings without end, 32 KiB at a time, and is killed mid-transfer:
    # its kernel sends the DREQ with work in flight; ibcm's server sees the DREQ, its QP
    # flushes, and it answers and exits cleanly.
    next_port
    bg A srv "ibcm rping -I $A_IP -p $RDMA_PORT -S 32768 --wait 60"
    wait_listening A srv || fail "ibcm server on A did not listen"
    guest B 60 "rping -c -a $A_IP -p $RDMA_PORT -C 0 -S 32768 -V > /tmp/dif.log 2>&1 & p=\$!; sleep 6; kill \$p; wait \$p; echo killed; cat /tmp/dif.log" >"$OUT/disconnect-in-flight.linux.txt" 2>&1 || true
    bg_wait A srv "$OUT/disconnect-in-flight.ibcm.txt"
    local f="$OUT/disconnect-in-flight.ibcm.txt" v
    v="$(pings "$f")"
    check "ibcm: the peer's DREQ arrived" has "$f" "rc: DREQ from the peer"
    check "ibcm: answered, disconnected" has "$f" "rc: disconnected"
    check "ibcm: some pings, all verified ($v)" eval "[ -n '$v' ] && [ '${v%/*}' = '${v#*/}' ] && [ '${v%/*}' -ge 1 ]"
    check "ibcm exited 0" has "$f" "exit=0"
}

scenario_peer-gone() {
    # ibcm's rping client pings a Linux `rping -s` that is killed 8 s in: Linux's kernel
    # sends the DREQ for the dead process (cm.c cm_destroy_id -> ib_send_cm_dreq), and
    # ibcm's run ends at once with the peer's DREQ as its reason, as Linux rping's client
    # does on RDMA_CM_EVENT_DISCONNECTED, not at its --wait deadline (30 s) after it.
    next_port
    bg B rping "rping -s -a $B_IP -p $RDMA_PORT -S 32768 -V"
    sleep 1
    guest B 10 "(sleep 8; kill \$(pidof rping)) >/dev/null 2>&1 &" >/dev/null
    guest A 120 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 100 ibcm rping -I $A_IP -a $B_IP -p $RDMA_PORT -C 1000000 -S 32768 --wait 30 > /tmp/pg.log 2>&1; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime); cat /tmp/pg.log" >"$OUT/peer-gone.ibcm.txt" 2>&1 || true
    bg_wait B rping "$OUT/peer-gone.linux.txt"
    local f="$OUT/peer-gone.ibcm.txt" ms
    ms="$(uptime_ms "$f")"
    check "ibcm: the peer's DREQ arrived" has "$f" "rc: DREQ from the peer"
    check "ibcm: answered, disconnected" has "$f" "rc: disconnected"
    check "ibcm: the run ended by the flush, reported" has "$f" "rping: FAILED: flushed"
    check "ibcm exited 1 (the run was cut short), not at a deadline" has "$f" "exit=1"
    check "ibcm ended within 8 s of the kill (${ms:-?} ms from its start; the deadline would add 30 s)" eval "[ -n '$ms' ] && [ '$ms' -lt 16000 ]"
}

scenario_baseline() {
    # Linux against Linux on the same two guests: A loads its kernel CM now.
    linux_cm_on A
    next_port
    bg B rping "rping -s -a $B_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE"
    sleep 1
    guest A 120 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 100 rping -c -a $B_IP -p $RDMA_PORT -v -V -C $PINGS -S $SIZE > /tmp/bl.log 2>&1; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime); echo verified=\$(grep -c '^ping data: rdma-ping-' /tmp/bl.log)" >"$OUT/baseline.linux-A.txt" 2>&1 || true
    bg_wait B rping "$OUT/baseline.linux-B.txt"
    check "Linux-Linux: $PINGS pings verified" has "$OUT/baseline.linux-A.txt" "verified=$PINGS"
    local ms
    ms="$(uptime_ms "$OUT/baseline.linux-A.txt")"
    [ -n "$ms" ] && FIG[linux_to_linux_rping_ms]="$ms"
    next_port
    guest B 10 "cmtime -b $B_IP -p $RDMA_PORT > /tmp/cmt.log 2>&1 & echo \$! > /tmp/cmt.pid" >/dev/null
    sleep 1
    guest A 120 "timeout 100 cmtime -s $B_IP -p $RDMA_PORT -c 1" >"$OUT/baseline.cmtime.txt" 2>&1 || fail "cmtime failed"
    guest B 10 "kill \$(cat /tmp/cmt.pid)" >/dev/null 2>&1 || true
    # Right after that kill the guest's control line has lost the head of the next
    # command once (26 characters): a padding command takes the loss, whatever part of it
    # survives is harmless.
    guest B 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true
    # cmtime's "connect" step for one connection: rdma_connect to ESTABLISHED.
    FIG[linux_linux_setup_ms]="$(awk '$1=="connect" && $2==":" {print $3}' "$OUT/baseline.cmtime.txt" | head -1)"
    setup_frames linux_linux linux linux "$SETUP_PAIRS"
    # perftest over rdma_cm, the same sizes as ibcm-ibcm-bw.
    for t in read send write; do
        next_port
        guest B 10 "timeout 120 ib_${t}_bw -R -F -p $RDMA_PORT -s 65536 -n 100 > /tmp/pt.log 2>&1 & echo \$! > /tmp/pt.pid" >/dev/null
        sleep 2
        guest A 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 120 ib_${t}_bw -R -F -p $RDMA_PORT -s 65536 -n 100 $B_IP; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/baseline.ib_${t}_bw.txt" 2>&1 || true
        guest B 20 "i=0; while kill -0 \$(cat /tmp/pt.pid) 2>/dev/null && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done; cat /tmp/pt.log" >>"$OUT/baseline.ib_${t}_bw.txt" 2>&1 || true
        # The result row: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate".
        FIG[linux_linux_${t}_mbps]="$(awk '$1=="65536" && $2=="100" {print $4; exit}' "$OUT/baseline.ib_${t}_bw.txt")"
        FIG[linux_linux_${t}_wall_ms]="$(uptime_ms "$OUT/baseline.ib_${t}_bw.txt")"
        check "ib_${t}_bw -R ran" eval "[ -n '${FIG[linux_linux_${t}_mbps]:-}' ]"
    done
    # The latency tests (perftest-lat's sizes): the client's row.
    for t in read send; do
        next_port
        guest B 10 "timeout 120 ib_${t}_lat -R -F -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS > /tmp/pt.log 2>&1 & echo \$! > /tmp/pt.pid" >/dev/null
        sleep 2
        # perftest's client does not retry its control connection: a server not listening
        # yet (seen once for ib_read_lat) is a REJ 8; a second attempt 2 s later.
        guest A 150 "for a in 1 2; do timeout 120 ib_${t}_lat -R -F -p $RDMA_PORT -s $PT_LAT_SIZE -n $PT_LAT_ITERS $B_IP > /tmp/ptc.log 2>&1; r=\$?; grep -q RDMA_CM_EVENT_REJECTED /tmp/ptc.log || break; sleep 2; done; cat /tmp/ptc.log; echo exit=\$r" >"$OUT/baseline.ib_${t}_lat.txt" 2>&1 || true
        guest B 20 "i=0; while kill -0 \$(cat /tmp/pt.pid) 2>/dev/null && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done; cat /tmp/pt.log" >>"$OUT/baseline.ib_${t}_lat.txt" 2>&1 || true
        FIG[linux_linux_${t}_lat_us]="$(pt_lat "$OUT/baseline.ib_${t}_lat.txt" | awk '{print $5}')"
        check "ib_${t}_lat -R ran" eval "[ -n '${FIG[linux_linux_${t}_lat_us]:-}' ]"
    done
    # ucmatose -c UC_MANY (ucmatose-many's), the client's wall time.
    next_port
    guest B 10 "timeout 140 ucmatose -b $B_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100 > /tmp/uc.log 2>&1 & echo \$! > /tmp/uc.pid" >/dev/null
    sleep 1
    guest A 150 "t0=\$(cut -d' ' -f1 /proc/uptime); timeout 140 ucmatose -s $B_IP -p $RDMA_PORT -c $UC_MANY -C $UC_COUNT -S 100; echo exit=\$?; echo uptime=\$t0,\$(cut -d' ' -f1 /proc/uptime)" >"$OUT/baseline.ucmatose-many.txt" 2>&1 || true
    guest B 20 "i=0; while kill -0 \$(cat /tmp/uc.pid) 2>/dev/null && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done; cat /tmp/uc.log" >>"$OUT/baseline.ucmatose-many.txt" 2>&1 || true
    check "Linux-Linux ucmatose -c $UC_MANY passed" has "$OUT/baseline.ucmatose-many.txt" "exit=0"
    FIG[linux_linux_ucmatose_many_ms]="$(uptime_ms "$OUT/baseline.ucmatose-many.txt")"
}

# The cmtime scenarios (ibcm cmtime/listen on real QPs against Linux cmtime, both roles).
# shellcheck source=tests/interop/data-plane-cmtime.sh
source "$here/data-plane-cmtime.sh"

cm_on_b=""
for current in "${scenarios[@]}"; do
    case "$current" in
        ibcm-ibcm | ibcm-ibcm-bw | cmtime-ibcm | udaddy-ibcm) [ -z "$cm_on_b" ] || { note "$current: needs B without its CM: run it before the Linux scenarios"; continue; } ;;
        *) if [ -z "$cm_on_b" ]; then linux_cm_on B; cm_on_b=1; fi ;;
    esac
    WHY[$current]=""
    s0=$(date +%s.%N)
    echo "---- $current"
    "scenario_$current"
    SECS[$current]="$(printf '%.1f' "$(echo "$(date +%s.%N) - $s0" | bc)")"
    if [ -z "${WHY[$current]}" ]; then RESULT[$current]=PASS; else RESULT[$current]=FAIL; fi
    note "$current: ${RESULT[$current]} (${SECS[$current]} s) ${WHY[$current]}"
    if [ "${RESULT[$current]}" = FAIL ]; then
        for f in "$OUT/$current".*.txt; do
            [ -f "$f" ] || continue
            echo "---- $(basename "$f") (last 20 lines)"
            tail -20 "$f"
        done
    fi
done

for g in A B; do guest "$g" 5 "poweroff -f" >/dev/null 2>&1 || true; done

echo
echo "data-plane results ($PINGS pings of $SIZE B per rping run, ibcm $PROFILE; outputs in $OUT):"
failed=0
for s in "${scenarios[@]}"; do
    [ -n "${RESULT[$s]:-}" ] || continue
    printf '  %-22s %s  %6s s  %s\n' "$s" "${RESULT[$s]}" "${SECS[$s]}" "${WHY[$s]}"
    [ "${RESULT[$s]}" = PASS ] || failed=$((failed + 1))
done
echo
echo "figures (qemu $QEMU_VERSION TCG guests, soft-RoCE; MB/s as perftest's, 2^20 B/s, perftest_parameters.c:3377):"
[ "$(qemu_major)" -ge 8 ] || echo "  (qemu before 8.0 translates every new process's code again, Linux's kernel CM's once: user-space start-up and first connections are inflated; tests/interop/qemu-tcg.sh)"
ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ] && [ "$(echo "$2 > 0" | bc)" = 1 ]; then printf '%.2f' "$(echo "$1 / $2" | bc -l)"; else echo "n/a"; fi; }
row() { printf '  %-74s %10s %10s   %s\n' "$1" "${2:-n/a}" "${3:-n/a}" "$(ratio "${2:-}" "${3:-}")"; }
printf '  %-74s %10s %10s   %s\n' "" "ibcm" "Linux" "ratio"
row "connection setup, REQ to RTU on the bridge, fresh rping pairs, median of $SETUP_PAIRS, ms (ibcm -> ibcm)" "${FIG[setup_ibcm_ibcm_ms]:-}" "${FIG[setup_linux_linux_ms]:-}"
row "connection setup, REQ to RTU on the bridge, fresh rping pairs, median of $SETUP_PAIRS, ms (ibcm -> Linux)" "${FIG[setup_ibcm_linux_ms]:-}" "${FIG[setup_linux_linux_ms]:-}"
row "connection setup, REQ to RTU on the bridge, fresh rping pairs, median of $SETUP_PAIRS, ms (Linux -> ibcm)" "${FIG[setup_linux_ibcm_ms]:-}" "${FIG[setup_linux_linux_ms]:-}"
row "rping client -> Linux rping -s, $PINGS x $SIZE B, wall ms (client: ibcm / Linux)" "${FIG[ibcm_to_linux_rping_ms]:-}" "${FIG[linux_to_linux_rping_ms]:-}"
row "rping client: process start to its first REQ, ms, median of 10, in turn (ibcm / Linux rping -c)" "${FIG[ibcm_first_req_ms]:-}" "${FIG[linux_first_req_ms]:-}"
row "Linux rping -c -> rping server, $PINGS x $SIZE B, wall ms (server: ibcm / Linux)" "${FIG[linux_to_ibcm_rping_ms]:-}" "${FIG[linux_to_linux_rping_ms]:-}"
# rc-bw reports 10^6 B/s: in perftest's unit for the comparison.
mib() { [ -n "${1:-}" ] && printf '%.2f' "$(echo "$1 / 1.048576" | bc -l)"; }
row "RDMA READ 100 x 64 KiB, MB/s (rc-bw ibcm-ibcm / ib_read_bw -R Linux-Linux)" "$(mib "${FIG[ibcm_read_mbps]:-}")" "${FIG[linux_linux_read_mbps]:-}"
row "SEND 100 x 64 KiB, MB/s (rc-bw ibcm-ibcm / ib_send_bw -R Linux-Linux)" "$(mib "${FIG[ibcm_send_mbps]:-}")" "${FIG[linux_linux_send_mbps]:-}"
row "ib_read_bw -R client -> server, MB/s (server: ibcm / Linux)" "${FIG[linux_to_ibcm_read_mbps]:-}" "${FIG[linux_linux_read_mbps]:-}"
row "ib_send_bw -R client -> server, MB/s (server: ibcm / Linux)" "${FIG[linux_to_ibcm_send_mbps]:-}" "${FIG[linux_linux_send_mbps]:-}"
row "RDMA READ client -> ib_read_bw -R server, MB/s (client: ibcm perftest / Linux)" "${FIG[ibcm_to_linux_read_mbps]:-}" "${FIG[linux_linux_read_mbps]:-}"
row "SEND client -> ib_send_bw -R server, MB/s (client: ibcm perftest / Linux)" "${FIG[ibcm_to_linux_send_mbps]:-}" "${FIG[linux_linux_send_mbps]:-}"
row "ib_write_bw -R client -> server, MB/s (server: ibcm / Linux)" "${FIG[linux_to_ibcm_write_mbps]:-}" "${FIG[linux_linux_write_mbps]:-}"
row "RDMA WRITE client -> ib_write_bw -R server, MB/s (client: ibcm perftest / Linux)" "${FIG[ibcm_to_linux_write_mbps]:-}" "${FIG[linux_linux_write_mbps]:-}"
# ibcm's latency timings are not perftest's (its waits sleep on the completion channel,
# its checks run inside the timed loop: cli_perftest.rs), so these four rows are not a
# comparison.
echo "  (latency rows: ibcm's side waits event-driven and checks every message; perftest busy-polls: not comparable)"
row "ib_read_lat -R client -> server, t_typical usec (server: ibcm / Linux)" "${FIG[linux_to_ibcm_read_lat_us]:-}" "${FIG[linux_linux_read_lat_us]:-}"
row "ib_send_lat -R client -> server, t_typical usec (server: ibcm / Linux)" "${FIG[linux_to_ibcm_send_lat_us]:-}" "${FIG[linux_linux_send_lat_us]:-}"
row "READ latency client -> ib_read_lat -R server, t_typical usec (client: ibcm / Linux)" "${FIG[ibcm_to_linux_read_lat_us]:-}" "${FIG[linux_linux_read_lat_us]:-}"
row "SEND latency client -> ib_send_lat -R server, t_typical usec (client: ibcm / Linux)" "${FIG[ibcm_to_linux_send_lat_us]:-}" "${FIG[linux_linux_send_lat_us]:-}"
row "ucmatose -c $UC_MANY -C $UC_COUNT, client wall ms (ibcm client -> Linux / Linux -> Linux)" "${FIG[ibcm_to_linux_ucmatose_many_ms]:-}" "${FIG[linux_linux_ucmatose_many_ms]:-}"
row "ucmatose -c $UC_MANY -C $UC_COUNT, client wall ms (Linux client -> ibcm / Linux -> Linux)" "${FIG[linux_to_ibcm_ucmatose_many_ms]:-}" "${FIG[linux_linux_ucmatose_many_ms]:-}"
row "perftest -R run, wall ms incl. both connections (ib_read_bw client -> server: ibcm / Linux)" "${FIG[linux_to_ibcm_read_wall_ms]:-}" "${FIG[linux_linux_read_wall_ms]:-}"
cmtime_figures
echo "  (setup: an rping client and server started for one connection, timed the same way for"
echo "  both stacks on the bridge's clock (setup_frames); both servers make their QP and buffers on"
echo "  the REQ (ibcm's: QP, CQ, channel, one MR; rping.c's: also a PD, three more MRs and a thread),"
echo "  both sides' QPs reach RTS inside it. rping wall times include process start, address"
echo "  resolution, setup and teardown on both sides."
echo "  The first connection of ibcm-ibcm (in a whole run, the first after the guests boot: the"
echo "  ARP and the guests' first run of every code path inside it) and of linux-server, on ibcm's"
echo "  client's clock: ${FIG[ibcm_ibcm_setup_ms]:-n/a} ms ibcm -> ibcm, ${FIG[ibcm_linux_setup_ms]:-n/a} ms ibcm -> Linux; Linux cmtime -c 1's"
echo "  connect step: ${FIG[linux_linux_setup_ms]:-n/a} ms.)"
total="$(printf '%.1f' "$(echo "$(date +%s.%N) - $t_start" | bc)")"
echo
echo "$(( ${#RESULT[@]} - failed )) passed, $failed failed"
echo "data-plane: total ${total} s"
[ "$failed" -eq 0 ]
