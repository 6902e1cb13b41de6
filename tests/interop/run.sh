#!/usr/bin/env bash
# Interop harness: ibcm against Linux ib_cm/rdma_cm over soft-RoCE (rdma_rxe) in a qemu VM.
#
#   tests/interop/run.sh [SCENARIO...]          (as root; default: every scenario)
#
# Scenarios: active passive passive-ends beside-al reject-ours reject-linux stale
# retransmit-ours retransmit-linux timing.
#
# What it does, all of it self-contained and undone on exit (trap):
# - installs the host packages it needs (qemu-system-x86, busybox-static, cpio, kmod,
#   iproute2, tcpdump, binutils) if a command is missing;
# - builds the guest (tests/interop/build-guest.sh: a Debian kernel and an initramfs made
#   from `apt-get download`ed packages, cached under target/interop/);
# - builds `ibcm` and the pcap checker (cargo, debug profile unless IBCM_PROFILE=release);
# - creates a network namespace with a tap device (10.77.0.1/24, no default route, IPv6
#   off) and boots the guest on it under qemu TCG (guest 10.77.0.2/24, rxe0 on eth0);
#   nothing else is reachable from either side;
# - runs each scenario: `ibcm` on the host side of the tap (a RoCEv2 port on a raw socket,
#   inside the namespace), rdma-core's `cmtime` in the guest, the link captured by
#   tcpdump and every capture checked by the project's pcap reader (ICRC of every frame);
#   beside-al runs two CMs on the host node (ibcm's and a stand-in for WinOF AL's, every
#   received MAD steered by ibcm's engine) and Linux connects to a service of each;
# - prints a PASS/FAIL line per scenario, the timing comparison, and the total time.
#
# Environment: IBCM_INTEROP_N (connections of the bulk scenarios, default 50),
# IBCM_PROFILE (debug|release), IBCM_INTEROP_OUT (results, default
# target/interop/results). A missing qemu, tun device or namespace support fails loudly.
set -euo pipefail
# modinfo, ip and friends live in sbin, which a non-login root shell (a chroot, sudo -s)
# may not have on its PATH.
export PATH="$PATH:/usr/sbin:/sbin"

here="$(cd "$(dirname "$0")" && pwd)"
source "$here/guest-ctl.sh"
repo="$(cd "$here/../.." && pwd)"
N="${IBCM_INTEROP_N:-50}"
PROFILE="${IBCM_PROFILE:-debug}"
OUT="${IBCM_INTEROP_OUT:-$repo/target/interop/results}"
HOST_IP=10.77.0.1
GUEST_IP=10.77.0.2
PORT=7471
AL_PORT=7472
ALL_SCENARIOS=(active passive passive-ends beside-al retransmit-ours retransmit-linux reject-ours reject-linux stale timing)
t_start=$(date +%s.%N)

die() { echo "interop: FAIL: $*" >&2; exit 1; }
note() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $t_start" | bc)" "$*"; }

[ "$(id -u)" -eq 0 ] || die "must run as root (network namespace, tap device, raw socket)"

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
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v readelf >/dev/null || need+=(binutils)
command -v bc >/dev/null || need+=(bc)
if [ ${#need[@]} -gt 0 ]; then
    note "installing host packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${need[@]}" >/tmp/ibcm-interop-apt.log 2>&1; then
        apt-get update >>/tmp/ibcm-interop-apt.log 2>&1 || true
        apt-get install -y --no-install-recommends "${need[@]}" >>/tmp/ibcm-interop-apt.log 2>&1 ||
            { tail -20 /tmp/ibcm-interop-apt.log >&2; die "apt-get install ${need[*]} failed"; }
    fi
fi
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing after install"
[ -c /dev/net/tun ] || die "/dev/net/tun is missing: no tap devices here"

# ---- guest and binaries -------------------------------------------------------------------
note "guest: building (cached under target/interop)"
mapfile -t boot < <("$here/build-guest.sh" "$repo/target/interop")
[ "${#boot[@]}" -ge 2 ] || die "guest build failed (see above)"
KERNEL="${boot[0]}"
INITRD="${boot[1]}"
[ -f "$KERNEL" ] && [ -f "$INITRD" ] || die "guest build produced no kernel/initramfs"

note "building ibcm and the pcap checker ($PROFILE)"
cargo_flags=()
[ "$PROFILE" = release ] && cargo_flags+=(--release)
(cd "$repo" && cargo build -q "${cargo_flags[@]}" -p ibcm-cli --bin ibcm &&
    cargo build -q "${cargo_flags[@]}" -p ibcm-host --example rocev2_pcap) || die "cargo build failed"
IBCM="$repo/target/$PROFILE/ibcm"
CHECK="$repo/target/$PROFILE/examples/rocev2_pcap"

# ---- namespace, VM, cleanup ---------------------------------------------------------------
NS="ibcm-interop-$$"
WORK="$(mktemp -d /tmp/ibcm-interop.XXXXXX)"
rm -rf "$OUT"
mkdir -p "$OUT"
QEMU_PID=""
BG_PIDS=()
cleanup() {
    local rc=$?
    set +e
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill "$QEMU_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$QEMU_PID" 2>/dev/null
    fi
    for p in "${BG_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    ip netns del "$NS" 2>/dev/null
    [ -f "$WORK/console.log" ] && cp "$WORK/console.log" "$OUT/guest-console.log"
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS" || die "cannot create network namespace $NS (ip netns add)"
ip -n "$NS" link set lo up
ip -n "$NS" tuntap add dev tap0 mode tap || die "cannot create a tap device in $NS"
ip -n "$NS" link set tap0 address 02:00:0a:4d:00:01
ip netns exec "$NS" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6'
ip -n "$NS" addr add "$HOST_IP/24" dev tap0
ip -n "$NS" link set tap0 up
[ -z "$(ip -n "$NS" route show default)" ] || die "the namespace has a default route"

mkfifo "$WORK/ctl.in" "$WORK/ctl.out"
exec {CTL_W}<>"$WORK/ctl.in" {CTL_R}<>"$WORK/ctl.out"
note "booting the Linux peer (qemu TCG) in namespace $NS"
ip netns exec "$NS" qemu-system-x86_64 -accel tcg -cpu max -m 512M -smp 1 \
    -nodefaults -display none -no-reboot -monitor none \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 panic=-1 quiet loglevel=4 ibcm.addr=$GUEST_IP/24" \
    -serial "file:$WORK/console.log" -serial "pipe:$WORK/ctl" \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02 \
    >"$WORK/qemu.out" 2>&1 &
QEMU_PID=$!

ready=""
while IFS= read -r -t 120 line <&"$CTL_R"; do
    case "$line" in *@@READY*) ready=1; break ;; esac
done
if [ -z "$ready" ]; then
    cat "$WORK/qemu.out" >&2
    tail -30 "$WORK/console.log" >&2 || true
    die "the guest did not come up within 120 s"
fi
note "guest ready: $(grep -a 'guest: eth0' "$WORK/console.log" | tail -1)"

# guest TIMEOUT COMMAND: runs COMMAND in the guest's shell, prints its output, returns its
# status (124 if no answer within TIMEOUT seconds of silence).
# The control line's protocol is tests/interop/guest-ctl.sh's.
guest() { ctl_run "$CTL_W" "$CTL_R" "$1" "$2" "the guest"; }

# The guest's cmtime server, fresh for each scenario (rdma-core 44's cmtime -b keeps the
# first connection's CQ in a shared attribute block: once that connection is destroyed,
# later QPs fail to be created and it rejects with reason 28).
linux_server_start() { guest 30 "cmtime -b $GUEST_IP -p $PORT > /tmp/srv.log 2>&1 & echo \$! > /tmp/srv.pid; sleep 1; kill -0 \$(cat /tmp/srv.pid)"; }
linux_server_stop() { guest 30 "kill \$(cat /tmp/srv.pid) 2>/dev/null; sleep 0.2; cat /tmp/srv.log" || true; }

CAP_PID=""
capture_start() { # capture_start NAME
    # --immediate-mode: every packet reaches tcpdump at once (not a ring block later), so
    # stopping it right after a scenario loses none; -s/-B: a small snap length and a big
    # buffer, for many ring slots (at the default snap length of 256 KiB the 2 MiB ring
    # holds 8 frames, and a burst of 50 REQs overflows it).
    ip netns exec "$NS" tcpdump -i tap0 --immediate-mode -s 1024 -B 16384 -U -Z root -w "$OUT/$1.pcap" udp port 4791 2>"$WORK/tcpdump.$1" &
    CAP_PID=$!
    BG_PIDS+=("$CAP_PID")
    for _ in $(seq 100); do grep -q 'listening on' "$WORK/tcpdump.$1" 2>/dev/null && return 0; sleep 0.05; done
    die "tcpdump did not start"
}
capture_stop() { # capture_stop NAME: stops the capture and checks it with the pcap reader
    sleep 0.5
    kill "$CAP_PID" 2>/dev/null || true
    wait "$CAP_PID" 2>/dev/null || true
    "$CHECK" "$OUT/$1.pcap" --quiet >"$OUT/$1.pcap.txt" 2>&1
}
# count NAME FROM ATTR: how many ATTR the capture holds from FROM.
count() { awk -v f="$2" -v a="$3" '$1=="count" && $2==f && $3==a {print $4; found=1} END {if (!found) print 0}' "$OUT/$1.pcap.txt"; }
rej_count() { awk -v f="$2" -v r="$3" '$1=="rej" && $2==f && $3==r {print $4; found=1} END {if (!found) print 0}' "$OUT/$1.pcap.txt"; }
dup_reqs() { awk -v f="$2" '$1=="duplicate-req" && $2==f {print $3; found=1} END {if (!found) print 0}' "$OUT/$1.pcap.txt"; }
# comm_space NAME FROM ATTR local|remote: "IN/OUT", how many of those comm IDs lie in
# ibcm's space beside AL (wire byte 2 >= 0xF0) and how many outside it.
comm_space() { awk -v f="$2" -v a="$3" -v w="$4" '$1=="comm-id" && $2==f && $3==a && $4==w {print $5 "/" $6; found=1} END {if (!found) print "0/0"}' "$OUT/$1.pcap.txt"; }
pcap_ok() { grep -q '^frames [0-9]* bad 0$' "$OUT/$1.pcap.txt"; }

# ibcm_bg NAME ARGS...: starts ibcm in the namespace, in the background, output to NAME.ibcm.txt.
IBCM_PID=""
ibcm_bg() {
    local name="$1"; shift
    ip netns exec "$NS" timeout 120 "$IBCM" "$@" >"$OUT/$name.ibcm.txt" 2>&1 &
    IBCM_PID=$!
    BG_PIDS+=("$IBCM_PID")
    for _ in $(seq 200); do grep -q 'listening on' "$OUT/$name.ibcm.txt" 2>/dev/null && return 0; sleep 0.05; done
    cat "$OUT/$name.ibcm.txt" >&2
    return 1
}
ibcm_wait() { local rc=0; wait "$IBCM_PID" || rc=$?; return $rc; }
ibcm_fg() { # ibcm_fg NAME ARGS...
    local name="$1"; shift
    local rc=0
    ip netns exec "$NS" timeout 120 "$IBCM" "$@" >"$OUT/$name.ibcm.txt" 2>&1 || rc=$?
    return $rc
}

declare -A RESULT=() WHY=() SECS=()
fail() { WHY[$current]+="$*; "; }
check() { # check DESCRIPTION COMMAND...: records a failure unless COMMAND succeeds
    local what="$1"; shift
    if ! "$@"; then fail "$what"; fi
}
eq() { [ "$1" = "$2" ]; }
ge() { [ "$1" -ge "$2" ]; }
has() { grep -q -- "$2" "$1"; }

declare -A TIMING=()
# linux_cmtime_ms FILE STEP: the "total ms" column of a Linux cmtime step.
linux_cmtime_ms() { awk -v s="$2" '$1==s && $2==":" {print $3}' "$1" | head -1; }

scenario_active() {
    linux_server_start >/dev/null || fail "cmtime -b did not start"
    capture_start active
    ibcm_fg active cmtime --bind "$HOST_IP" --server "$GUEST_IP" -c "$N" \
        --packet-life-time 12 --response-timeout 18 || fail "ibcm cmtime exited $?"
    capture_stop active || fail "pcap check"
    local f="$OUT/active.ibcm.txt"
    check "ibcm: $N/$N established" has "$f" "setup:    $N/$N established"
    check "ibcm: $N/$N disconnected" has "$f" "teardown: $N/$N disconnected"
    check "Linux cmtime -b still running" guest 10 "kill -0 \$(cat /tmp/srv.pid)"
    linux_server_stop >"$OUT/active.linux.txt" 2>&1
    check "Linux server logged no failure" eval '! grep -qi "fail\|error" "$OUT/active.linux.txt"'
    check "pcap: every frame good" pcap_ok active
    check "pcap: $N REQ from us" ge "$(count active $HOST_IP REQ)" "$N"
    check "pcap: $N REP from Linux" ge "$(count active $GUEST_IP REP)" "$N"
    check "pcap: $N RTU, DREQ from us" eq "$(count active $HOST_IP RTU)/$(count active $HOST_IP DREQ)" "$N/$N"
    check "pcap: $N DREP from Linux" eq "$(count active $GUEST_IP DREP)" "$N"
    TIMING[ibcm_to_linux_setup]="$(awk '/^setup:/ {print $5*1000}' "$f")"
    TIMING[ibcm_to_linux_teardown]="$(awk '/^teardown:/ {print $5*1000}' "$f")"
}

passive_common() { # passive_common NAME [ibcm listen flags...]
    local name="$1"; shift
    capture_start "$name"
    ibcm_bg "$name" listen --bind "$HOST_IP" -p "$PORT" -c "$N" --wait 60 "$@" || fail "ibcm listen did not start"
    guest 120 "timeout 100 cmtime -s $HOST_IP -p $PORT -c $N; echo cmtime-exit=\$?" >"$OUT/$name.linux.txt" 2>&1 ||
        fail "guest command failed"
    ibcm_wait || fail "ibcm listen exited $?"
    capture_stop "$name" || fail "pcap check"
    local f="$OUT/$name.ibcm.txt" l="$OUT/$name.linux.txt"
    check "Linux cmtime -s exited 0" has "$l" "cmtime-exit=0"
    check "Linux saw no error event" eval "! grep -q 'event: RDMA_CM_EVENT' '$l'"
    check "ibcm: $N REQs with the RDMA-CM IP header" has "$f" "listen: $N REQs ($N with an RDMA-CM IP header naming $HOST_IP), $N established, $N ended"
    check "pcap: every frame good" pcap_ok "$name"
    check "pcap: $N REQ, RTU from Linux" eq "$(count "$name" $GUEST_IP REQ)/$(count "$name" $GUEST_IP RTU)" "$N/$N"
    check "pcap: $N REP from us" eq "$(count "$name" $HOST_IP REP)" "$N"
}

scenario_passive() {
    passive_common passive
    check "pcap: $N DREQ from Linux, DREP from us" eq "$(count passive $GUEST_IP DREQ)/$(count passive $HOST_IP DREP)" "$N/$N"
    TIMING[linux_to_ibcm_connect]="$(linux_cmtime_ms "$OUT/passive.linux.txt" connect)"
    TIMING[linux_to_ibcm_disconnect]="$(linux_cmtime_ms "$OUT/passive.linux.txt" disconnect)"
}

scenario_passive-ends() {
    passive_common passive-ends --disconnect
    check "pcap: $N DREQ from us, DREP from Linux" eq "$(count passive-ends $HOST_IP DREQ)/$(count passive-ends $GUEST_IP DREP)" "$N/$N"
}

# steer_row FILE ATTR: "ibcm/AL" of the beside-al steering table's row ATTR (3 fields;
# the counter tables' rows have 5).
steer_row() { awk -v a="$2" '$1==a && NF==3 {print $2 "/" $3; found=1} END {if (!found) print "0/0"}' "$1"; }

scenario_beside-al() {
    # Issue #19: one host node carries two CMs, ibcm's (port $PORT) and a stand-in for WinOF
    # AL's (port $AL_PORT), every received CM MAD steered by ibcm's owner_of; Linux connects
    # to both services at once.
    capture_start beside-al
    ibcm_bg beside-al listen --bind "$HOST_IP" -p "$PORT" --beside-al "$AL_PORT" -c "$N" --wait 60 ||
        fail "ibcm listen --beside-al did not start"
    # Both CMs listen before Linux connects (ibcm_bg waits for the first).
    for _ in $(seq 100); do
        [ "$(grep -c 'listening on' "$OUT/beside-al.ibcm.txt")" -ge 2 ] && break
        sleep 0.05
    done
    guest 120 "timeout 100 cmtime -s $HOST_IP -p $AL_PORT -c $N > /tmp/al.log 2>&1 & p=\$!; timeout 100 cmtime -s $HOST_IP -p $PORT -c $N; echo ibcm-exit=\$?; wait \$p; echo al-exit=\$?; cat /tmp/al.log" \
        >"$OUT/beside-al.linux.txt" 2>&1 || fail "guest command failed"
    ibcm_wait || fail "ibcm listen exited $?"
    capture_stop beside-al || fail "pcap check"
    local f="$OUT/beside-al.ibcm.txt" l="$OUT/beside-al.linux.txt" cm a
    check "Linux cmtime -s to ibcm's service exited 0" has "$l" "ibcm-exit=0"
    check "Linux cmtime -s to AL's service exited 0" has "$l" "al-exit=0"
    check "Linux saw no error event" eval "! grep -q 'event: RDMA_CM_EVENT' '$l'"
    for cm in ibcm AL; do
        check "$cm: $N REQs served, established and ended" has "$f" \
            "listen \[$cm\]: $N REQs ($N with an RDMA-CM IP header naming $HOST_IP), $N established, $N ended"
    done
    # Each CM got its own REQs, and the RTUs and DREQs naming its comm IDs; nothing else.
    for a in REQ RTU DREQ; do
        check "steering: $N $a to ibcm, $N to AL" eq "$(steer_row "$f" "$a")" "$N/$N"
    done
    check "steering: no other MAD" eq "$(steer_row "$f" total)" "$((3 * N))/$((3 * N))"
    check "both CMs: nothing malformed or unmatched" eq "$(grep -c 'malformed 0, unmatched 0' "$f")" 2
    check "pcap: every frame good" pcap_ok beside-al
    check "pcap: $((2 * N)) REQ, RTU, DREQ from Linux" \
        eq "$(count beside-al $GUEST_IP REQ)/$(count beside-al $GUEST_IP RTU)/$(count beside-al $GUEST_IP DREQ)" "$((2 * N))/$((2 * N))/$((2 * N))"
    check "pcap: $((2 * N)) REP, DREP from us" \
        eq "$(count beside-al $HOST_IP REP)/$(count beside-al $HOST_IP DREP)" "$((2 * N))/$((2 * N))"
    # On the wire: each CM answered from its own comm ID space, and Linux's RTUs and DREQs
    # named IDs of both.
    for a in REP DREP; do
        check "pcap: $N $a from ibcm's comm ID space, $N from AL's" eq "$(comm_space beside-al $HOST_IP $a local)" "$N/$N"
    done
    for a in RTU DREQ; do
        check "pcap: $N Linux $a to ibcm's comm IDs, $N to AL's" eq "$(comm_space beside-al $GUEST_IP $a remote)" "$N/$N"
    done
}

scenario_retransmit-ours() {
    linux_server_start >/dev/null || fail "cmtime -b did not start"
    capture_start retransmit-ours
    ibcm_fg retransmit-ours connect --bind "$HOST_IP" --server "$GUEST_IP" -p "$PORT" -c 1 --drop-tx REQ:3 --wait 30 ||
        fail "ibcm connect exited $?"
    capture_stop retransmit-ours || fail "pcap check"
    linux_server_stop >"$OUT/retransmit-ours.linux.txt" 2>&1
    local f="$OUT/retransmit-ours.ibcm.txt"
    # Retries: the 3 lost ones, and more if the guest took longer than a retry interval
    # (1.1 s) to answer; every REQ past the lost ones is on the wire, all one comm ID.
    local retries
    retries="$(awk '$1=="REQ" && NF==5 {print $3}' "$f")"
    check "ibcm: established after 3 lost REQs" has "$f" "setup:    1/1 established"
    check "ibcm: at least 3 REQ retries counted" ge "${retries:-0}" 3
    check "ibcm: 3 REQs dropped by fault injection" has "$f" "fault injection dropped 3 outgoing"
    check "pcap: every frame good" pcap_ok retransmit-ours
    check "pcap: the REQs past the lost ones on the wire, one comm ID" \
        eq "$(count retransmit-ours $HOST_IP REQ)/$(dup_reqs retransmit-ours $HOST_IP)" "$((${retries:-0} - 2))/$((${retries:-0} - 3))"
    check "pcap: REP, DREP from Linux" eq "$(count retransmit-ours $GUEST_IP REP)/$(count retransmit-ours $GUEST_IP DREP)" 1/1
}

scenario_retransmit-linux() {
    capture_start retransmit-linux
    ibcm_bg retransmit-linux listen --bind "$HOST_IP" -p "$PORT" -c 1 --wait 30 --drop-tx REP:1 || fail "ibcm listen did not start"
    guest 60 "timeout 40 cmtime -s $HOST_IP -p $PORT -c 1; echo cmtime-exit=\$?" >"$OUT/retransmit-linux.linux.txt" 2>&1 ||
        fail "guest command failed"
    ibcm_wait || fail "ibcm listen exited $?"
    capture_stop retransmit-linux || fail "pcap check"
    local f="$OUT/retransmit-linux.ibcm.txt"
    check "Linux cmtime -s exited 0" has "$OUT/retransmit-linux.linux.txt" "cmtime-exit=0"
    check "ibcm: established and ended" has "$f" "1 established, 1 ended"
    check "ibcm: the REQ received twice, once as a duplicate" grep -qE '^  REQ +0 +0 +2 +1$' "$f"
    check "pcap: every frame good" pcap_ok retransmit-linux
    check "pcap: Linux re-sent its REQ (same comm ID)" eq "$(count retransmit-linux $GUEST_IP REQ)/$(dup_reqs retransmit-linux $GUEST_IP)" 2/1
    # The first REP never reaches the wire; the re-sent REQ is answered with a REP (our own
    # REP retry, due about 0.3 s after Linux's REQ retry, may add one when the host is slow).
    check "pcap: a REP on the wire (the first one was dropped before it)" ge "$(count retransmit-linux $HOST_IP REP)" 1
}

scenario_reject-ours() {
    capture_start reject-ours
    # A listener on another service: the REQ for port $PORT finds none.
    ibcm_bg reject-ours listen --bind "$HOST_IP" -p 7000 -c 1 --wait 4 || fail "ibcm listen did not start"
    guest 60 "timeout 30 cmtime -s $HOST_IP -p $PORT -c 1; echo cmtime-exit=\$?" >"$OUT/reject-ours.linux.txt" 2>&1 ||
        fail "guest command failed"
    ibcm_wait || true
    capture_stop reject-ours || fail "pcap check"
    check "Linux sees REJECTED with reason 8 (invalid service ID)" has "$OUT/reject-ours.linux.txt" "RDMA_CM_EVENT_REJECTED, error: 8"
    check "pcap: every frame good" pcap_ok reject-ours
    check "pcap: REJ reason 8 from us" eq "$(rej_count reject-ours $HOST_IP 8)" 1
}

scenario_reject-linux() {
    capture_start reject-linux
    local rc=0
    ibcm_fg reject-linux connect --bind "$HOST_IP" --server "$GUEST_IP" -p "$PORT" -c 1 --wait 30 || rc=$?
    capture_stop reject-linux || fail "pcap check"
    check "ibcm connect exits 1 (rejected)" eq "$rc" 1
    check "ibcm reports Linux's REJ reason 8" has "$OUT/reject-linux.ibcm.txt" "rejected by the peer, reason InvalidServiceId (8)"
    check "pcap: every frame good" pcap_ok reject-linux
    check "pcap: REJ reason 8 from Linux" eq "$(rej_count reject-linux $GUEST_IP 8)" 1
}

scenario_stale() {
    linux_server_start >/dev/null || fail "cmtime -b did not start"
    capture_start stale
    local rc=0
    ibcm_fg stale connect --bind "$HOST_IP" --server "$GUEST_IP" -p "$PORT" -c 2 --reuse-qpn --wait 30 || rc=$?
    capture_stop stale || fail "pcap check"
    linux_server_stop >"$OUT/stale.linux.txt" 2>&1
    local f="$OUT/stale.ibcm.txt"
    check "ibcm connect exits 1 (one rejected)" eq "$rc" 1
    check "the first connection established" has "$f" "connection 0: established"
    check "ibcm reports Linux's REJ reason 10 for the reused QPN" has "$f" "connection 1: connect: rejected by the peer, reason StaleConn (10)"
    check "Linux disconnected the old connection (DREQ), ibcm answered" has "$f" "1/1 disconnected in"
    check "pcap: every frame good" pcap_ok stale
    check "pcap: REJ reason 10 and a DREQ from Linux" eq "$(rej_count stale $GUEST_IP 10)/$(count stale $GUEST_IP DREQ)" 1/1
}

scenario_timing() {
    # Linux against itself, both ends in the guest: the baseline for the ratios.
    guest 120 "cmtime -b $GUEST_IP -p 7472 > /tmp/ll.log 2>&1 & p=\$!; sleep 1; timeout 100 cmtime -s $GUEST_IP -p 7472 -c $N; echo cmtime-exit=\$?; kill \$p" \
        >"$OUT/timing.linux.txt" 2>&1 || fail "guest command failed"
    check "Linux-Linux cmtime exited 0" has "$OUT/timing.linux.txt" "cmtime-exit=0"
    TIMING[linux_to_linux_connect]="$(linux_cmtime_ms "$OUT/timing.linux.txt" connect)"
    TIMING[linux_to_linux_disconnect]="$(linux_cmtime_ms "$OUT/timing.linux.txt" disconnect)"
}

for current in "${scenarios[@]}"; do
    WHY[$current]=""
    s0=$(date +%s.%N)
    "scenario_$current"
    SECS[$current]="$(printf '%.1f' "$(echo "$(date +%s.%N) - $s0" | bc)")"
    if [ -z "${WHY[$current]}" ]; then RESULT[$current]=PASS; else RESULT[$current]=FAIL; fi
    note "$current: ${RESULT[$current]} (${SECS[$current]} s) ${WHY[$current]}"
    if [ "${RESULT[$current]}" = FAIL ]; then
        for f in "$OUT/$current".*.txt; do
            [ -f "$f" ] || continue
            echo "---- $(basename "$f") (last 25 lines)"
            tail -25 "$f"
        done
    fi
done

guest 10 "rdma statistic show link rxe0/1" >"$OUT/rxe-statistics.txt" 2>&1 || true
guest 5 "poweroff -f" >/dev/null 2>&1 || true

echo
echo "interop results (N=$N, ibcm $PROFILE build; outputs and captures in $OUT):"
failed=0
for s in "${scenarios[@]}"; do
    printf '  %-18s %s  %6s s  %s\n' "$s" "${RESULT[$s]}" "${SECS[$s]}" "${WHY[$s]}"
    [ "${RESULT[$s]}" = PASS ] || failed=$((failed + 1))
done
if [ -f "$OUT/beside-al.ibcm.txt" ]; then
    echo
    echo "beside-al: per-CM counts on the shared host node (MADs received, by ibcm's owner_of):"
    awk '/^steering,/ {on=1; next} on && NF==0 {exit} on {print}' "$OUT/beside-al.ibcm.txt"
fi
ratio() { if [ -n "${1:-}" ] && [ -n "${2:-}" ] && [ "$(echo "$2 > 0" | bc)" = 1 ]; then printf '%.2f' "$(echo "$1 / $2" | bc -l)"; else echo "n/a"; fi; }
if [ -n "${TIMING[linux_to_linux_connect]:-}" ]; then
    echo
    echo "timing, $N connections (ms, each side's own clock):"
    printf '  Linux cmtime -s -> Linux cmtime -b (both in the guest): connect %s, disconnect %s\n' \
        "${TIMING[linux_to_linux_connect]}" "${TIMING[linux_to_linux_disconnect]}"
    if [ -n "${TIMING[linux_to_ibcm_connect]:-}" ]; then
        printf '  Linux cmtime -s -> ibcm listen:                        connect %s, disconnect %s  (ratio to Linux-Linux: %s, %s)\n' \
            "${TIMING[linux_to_ibcm_connect]}" "${TIMING[linux_to_ibcm_disconnect]}" \
            "$(ratio "${TIMING[linux_to_ibcm_connect]}" "${TIMING[linux_to_linux_connect]}")" \
            "$(ratio "${TIMING[linux_to_ibcm_disconnect]}" "${TIMING[linux_to_linux_disconnect]}")"
    fi
    if [ -n "${TIMING[ibcm_to_linux_setup]:-}" ]; then
        printf '  ibcm cmtime -> Linux cmtime -b:                        connect %s, disconnect %s  (ratio to Linux-Linux: %s, %s)\n' \
            "${TIMING[ibcm_to_linux_setup]}" "${TIMING[ibcm_to_linux_teardown]}" \
            "$(ratio "${TIMING[ibcm_to_linux_setup]}" "${TIMING[linux_to_linux_connect]}")" \
            "$(ratio "${TIMING[ibcm_to_linux_teardown]}" "${TIMING[linux_to_linux_disconnect]}")"
    fi
fi
total="$(printf '%.1f' "$(echo "$(date +%s.%N) - $t_start" | bc)")"
echo
echo "$((${#scenarios[@]} - failed)) passed, $failed failed"
echo "interop: total ${total} s"
[ "$failed" -eq 0 ]
