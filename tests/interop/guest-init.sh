#!/bin/busybox sh
# PID 1 of the interop harness's Linux peer (built into the initramfs by build-guest.sh).
#
# Loads the soft-RoCE and CM modules (but those named in ibcm.skip=a,b,c on the kernel
# command line: a node running ibcm leaves the kernel's CM out, load them later with
# `load_skipped`), gives eth0 the address from the kernel command line
# (ibcm.addr=A.B.C.D/N), creates rxe0 on it, then serves the harness: every line read from
# the second serial port (ttyS1) is run by this shell, its output written back there,
# followed by "@@RC <exit status>". Each line runs in a subshell; a background job it
# starts keeps running (record its PID in a file to stop it later). The console (ttyS0)
# gets the kernel log and these messages, and each command as it is run. The harness powers the guest off with
# `poweroff -f`.
/bin/busybox mkdir -p /usr/sbin /usr/bin /sbin
/bin/busybox --install -s
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /run

addr=""
skip=""
for word in $(cat /proc/cmdline); do
    case "$word" in
        ibcm.addr=*) addr="${word#ibcm.addr=}" ;;
        ibcm.skip=*) skip=",${word#ibcm.skip=}," ;;
    esac
done
for m in $(cat /modules.order); do
    case "$skip" in *",$m,"*) echo "$m" >> /skipped.order; continue ;; esac
    insmod "/lib/modules/$m.ko" || echo "guest: insmod $m failed"
done
# The modules left out at boot, in load order (the harness's command).
load_skipped() {
    [ -f /skipped.order ] || return 0
    for m in $(cat /skipped.order); do insmod "/lib/modules/$m.ko" || return 1; done
    rm -f /skipped.order
}
[ -n "$addr" ] || addr=10.77.0.2/24

echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ip addr add "$addr" dev eth0
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0 || echo "guest: rdma link add failed"
echo "guest: eth0 $addr, $(cat /sys/class/net/eth0/address), $(rdma link show 2>&1)"

# The control channel: raw, no echo, and deaf to modem control (a carrier change must not
# hang the line up). Each command runs in a subshell, so nothing it does (a syntax error,
# an exit) can end PID 1; background jobs it starts keep running.
stty -F /dev/ttyS1 raw -echo clocal -hupcl 2>/dev/null
exec 3<>/dev/ttyS1
echo "@@READY" >&3
while true; do
    while IFS= read -r msg <&3; do
        # Each command comes as "@@CMD LENGTH COMMAND": a line whose head the serial line
        # lost (seen after a background job is killed on a loaded host) no longer matches
        # its length and is refused unrun, and the harness sends it again.
        case "$msg" in
            "@@CMD "*) rest="${msg#@@CMD }"; want="${rest%% *}"; line="${rest#* }" ;;
            *) want=-1; line="" ;;
        esac
        if [ "${#line}" != "$want" ]; then
            echo "guest: garbled, not run: $msg" > /dev/console
            printf '\n@@GARBLED\n' >&3
            continue
        fi
        echo "guest: run: $line" > /dev/console
        ( eval "$line" ) >&3 2>&1 </dev/null
        rc=$?
        printf '\n@@RC %s\n' "$rc" >&3
    done
    echo "guest: the control channel closed; reopening it" > /dev/console
    sleep 0.2
    exec 3<>/dev/ttyS1
    stty -F /dev/ttyS1 raw -echo clocal -hupcl 2>/dev/null
done
