# Sourced by tests/interop/data-plane.sh: connection setup timed like rdma-core `cmtime`,
# ibcm against Linux's `cmtime` in both roles and against itself, every connection with a
# real RC QP moved to RTS (ibcm: `--rdma-dev rxe0`, the user library's rdma backend), and
# Linux against Linux on the same guests. Uses the harness's guest/bg/check helpers.
#
# Scenarios (data-plane.sh's ALL_SCENARIOS orders them: the first needs B without its CM,
# the next two A without its CM, the last loads A's):
#   cmtime-ibcm           ibcm cmtime (A) -> ibcm listen (B)
#   cmtime-linux-server   ibcm cmtime (A) -> Linux `cmtime -b` (B)
#   cmtime-linux-client   Linux `cmtime -s` (B) -> ibcm listen (A)
#   cmtime-baseline       Linux `cmtime -s` (A) -> Linux `cmtime -b` (B)
# Each times IBCM_DP_CM_ONE connections one at a time against one server process (the
# median is the figure: the first connection of a process pays for its cold start, as
# neither the kernel's CM nor a loaded driver does), then IBCM_DP_CM_MANY at once, in
# IBCM_DP_CM_ROUNDS rounds (default 5) against a fresh server each (the median is the
# figure). After each run at once, both guests' rxe and kernel CM counters go beside its
# output (FILE.counters.A, .B).
#
# What is timed: Linux's `connect` step is rdma_connect to RDMA_CM_EVENT_ESTABLISHED (v44
# librdmacm/examples/cmtime.c:583-597), the server creating its QP and moving it to RTS
# before rdma_accept (:217-231, librdmacm's rdma_accept) and the client moving its QP to
# RTR and RTS before the RTU (librdmacm ucma_process_conn_resp). ibcm's `establish` is
# the same span: REQ sent to RTU sent, the QP's transitions on both sides included.
# Linux's address and route resolution are steps of their own, outside it (:529-564).

# IBCM_DP_CM_TRACE=1 adds ibcm's trace points (-vv: every state change, MAD read and
# written with its write time, setup steps) to the outputs, written to the guest's tmpfs
# during the run (not to its slow serial line) and appended after it.
CM_ONE="${IBCM_DP_CM_ONE:-10}"
CM_VV=""
[ -n "${IBCM_DP_CM_TRACE:-}" ] && CM_VV="-vv"
CM_MANY="${IBCM_DP_CM_MANY:-20}"
# The CM_MANY-at-once figure is the median of IBCM_DP_CM_ROUNDS rounds, each a fresh
# server and client (one round's figure moved by 2x between runs of the same tree: Linux's
# own ranged from 29 to 117 ms).
CM_ROUNDS="${IBCM_DP_CM_ROUNDS:-5}"
CM_ROUNDS_TEXT="median of $CM_ROUNDS rounds"
[ "$CM_ROUNDS" = 1 ] && CM_ROUNDS_TEXT="one round"

# median VALUES...: the median of numbers (the lower middle one of an even count).
median() { printf '%s\n' "$@" | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
# ibcm_establish FILE FIELD: a field (median, all) of ibcm's "establish (REQ -> RTU)" line.
ibcm_establish() {
    case "$2" in
        median) sed -n 's/^establish (REQ -> RTU): .* median \([0-9.]*\) ms.*/\1/p' "$1" | head -1 ;;
        all) sed -n 's/^establish (REQ -> RTU): .* all in \([0-9.]*\) ms.*/\1/p' "$1" | head -1 ;;
    esac
}
# ibcm_init FILE: the median ms of ibcm's "  of which INIT" step row (count, total ms,
# min us, median us, p99 us, max us, us/conn): the QP's move to INIT, made before its REQ
# as librdmacm makes Linux's (rdma_create_qp), outside both spans.
ibcm_init() { awk '$1=="of" && $2=="which" && $3=="INIT" {printf "%.2f\n", $7 / 1000; exit}' "$1"; }
# ibcm_first FILE: ibcm's "establish, 1st" row (its total ms): the process's first connection.
ibcm_first() { awk '$1=="establish," && $2=="1st" {print $4; exit}' "$1"; }
# linux_connect FILE: the total ms of Linux cmtime's connect step.
linux_connect() { awk '$1=="connect" && $2==":" {print $3; exit}' "$1"; }

# cm_ibcm_listen NAME ADDR TAG COUNT: ibcm serving COUNT connections in the background.
cm_ibcm_listen() {
    bg "$1" "$3" "ibcm listen $CM_VV --bind $2 --ib-dev rxe0 -p $RDMA_PORT -c $4 --wait 60"
    wait_listening "$1" "$3" || fail "ibcm listen on $1 did not listen"
}
# cm_linux_server NAME ADDR: Linux `cmtime -b` in the background (it serves until killed).
cm_linux_server() {
    guest "$1" 10 "cmtime -b $2 -p $RDMA_PORT > /tmp/cmb.log 2>&1 & echo \$! > /tmp/cmb.pid" >/dev/null
    sleep 1
}
cm_linux_server_stop() { guest "$1" 10 "kill \$(cat /tmp/cmb.pid); true" >/dev/null 2>&1 || true; }
# cm_ibcm_client FILE COUNT WINDOW: ibcm cmtime on A against B's listener, WINDOW
# connections in flight at once.
cm_ibcm_client() {
    guest A 120 "timeout 100 ibcm cmtime $CM_VV --bind $A_IP --ib-dev rxe0 --server $B_IP --port $RDMA_PORT -c $2 --window $3 --packet-life-time 12 --response-timeout 18 2>/tmp/cm.trace; echo exit=\$?; cat /tmp/cm.trace" >"$1" 2>&1 || true
}
# cm_server_log NAME TAG FILE: the background ibcm server's output; once more if the
# control line garbled the first request (the output has no exit status then).
cm_server_log() {
    bg_wait "$1" "$2" "$3"
    grep -q '^exit=' "$3" || bg_wait "$1" "$2" "$3"
}
# The guest's control line has lost the head of a command right after a kill: a padding
# command takes the loss.
cm_pad() { guest "$1" 10 ":; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; :; true" >/dev/null 2>&1 || true; }
# cm_counters FILE: both guests' rxe counters (packets sent and received) and, where the
# kernel's CM is loaded, its message counters, since boot, into FILE.A and FILE.B: a MAD
# retried or lost in a run at once shows there (one guest's sent against the other's
# received).
CM_COUNTERS='cd /sys/class/infiniband/rxe0/ports/1 && for c in hw_counters/*; do printf "%s=%s " "${c#hw_counters/}" "$(cat $c)"; done; echo; for d in cm_rx_msgs cm_tx_msgs cm_rx_duplicates cm_tx_retries; do [ -d $d ] || continue; printf "%s: " $d; for m in req mra rej rep rtu dreq drep; do printf "%s=%s " $m "$(cat $d/$m)"; done; echo; done'
cm_counters() { local g; for g in A B; do guest "$g" 10 "$CM_COUNTERS" >"$1.$g" 2>&1 || true; done; }

# cm_runs KIND: KIND is ibcm-ibcm, ibcm-linux, linux-ibcm or linux-linux (client-server).
# One connection at a time, CM_ONE times, against one server process (ibcm's client: one
# process, `--window 1`; Linux's: one `cmtime -c 1` each), the median of the connections'
# setup times; then CM_MANY connections at once (one client process). Sets CM_ONE_MS and
# CM_MANY_MS.
cm_runs() {
    local kind="$1" ms round rounds=() vals=() extra=""
    # One at a time: one round, its median of CM_ONE connections.
    cm_round "$kind" one "$CM_ONE" "$OUT/cmtime-$kind.one.txt"
    CM_ONE_MS="$ms"
    vals=("${ROUND_VALS[@]}")
    extra="$ROUND_EXTRA"
    # At once: the median of CM_ROUNDS rounds.
    for round in $(seq "$CM_ROUNDS"); do
        cm_round "$kind" many "$CM_MANY" "$OUT/cmtime-$kind.many$([ "$round" = 1 ] || echo ".$round").txt"
        rounds+=("$ms")
    done
    CM_MANY_MS="$(median "${rounds[@]}")"
    echo "  $kind: one connection at a time, median of $CM_ONE: ${CM_ONE_MS:-n/a} ms${vals[*]:+ (${vals[*]})}$extra; $CM_MANY connections at once, $CM_ROUNDS_TEXT: ${CM_MANY_MS:-n/a} ms"
}

# cm_round KIND RUN N FILE: one round: a fresh server, then N connections one at a time
# (RUN one: ibcm's client one process with `--window 1`, Linux's one `cmtime -c 1` each, the
# median of their setup times) or at once (RUN many), output in FILE. Sets ms (and, for
# RUN one, ROUND_VALS and ROUND_EXTRA).
cm_round() {
    local kind="$1" run="$2" n="$3" f="$4" one i
    ROUND_VALS=()
    ROUND_EXTRA=""
    ms=""
    next_port
    : >"$f"
    case "$kind" in
        *-linux) cm_linux_server B "$B_IP" ;;
    esac
    case "$kind" in
        ibcm-ibcm) cm_ibcm_listen B "$B_IP" cml "$n" ;;
        linux-ibcm) cm_ibcm_listen A "$A_IP" cml "$n" ;;
    esac
    case "$kind" in
        ibcm-*)
            if [ "$run" = one ]; then cm_ibcm_client "$f" "$n" 1; else cm_ibcm_client "$f" "$n" "$n"; fi
            check "$kind $run: ibcm exited 0" has "$f" "exit=0"
            check "$kind $run: $n/$n established" has "$f" "setup:    $n/$n established"
            if [ "$run" = one ]; then
                ms="$(ibcm_establish "$f" median)"
                # Beside it: the QP's INIT (before the REQ, as Linux's), and the
                # first connection of ibcm's warm process (Linux's one-at-a-time
                # figure is a fresh process's).
                ROUND_EXTRA="; ibcm's QP to INIT before the REQ, median $(ibcm_init "$f") ms; ibcm's first connection (fresh client) $(ibcm_first "$f") ms"
            else ms="$(ibcm_establish "$f" all)"; fi ;;
        *)
            local client="$A_IP" host=B
            [ "$kind" = linux-linux ] && host=A client="$B_IP"
            if [ "$run" = one ]; then
                for i in $(seq "$n"); do
                    guest "$host" 60 "timeout 50 cmtime -s $client -p $RDMA_PORT -c 1; echo exit=\$?" >"$f.$i" 2>&1 || true
                    check "$kind $run $i: Linux cmtime exited 0" has "$f.$i" "exit=0"
                    one="$(linux_connect "$f.$i")"
                    ROUND_VALS+=("$one")
                    cat "$f.$i" >>"$f"
                done
                ms="$(median "${ROUND_VALS[@]}")"
            else
                guest "$host" 120 "timeout 100 cmtime -s $client -p $RDMA_PORT -c $n; echo exit=\$?" >"$f" 2>&1 || true
                check "$kind $run: Linux cmtime exited 0" has "$f" "exit=0"
                ms="$(linux_connect "$f")"
            fi ;;
    esac
    [ "$run" = many ] && cm_counters "$f.counters"
    case "$kind" in
        ibcm-ibcm) cm_server_log B cml "$f.server" ;;
        linux-ibcm) cm_server_log A cml "$f.server" ;;
        *-linux) cm_linux_server_stop B; cm_pad B ;;
    esac
    case "$kind" in
        *-ibcm) check "$kind $run: ibcm served $n" has "$f.server" "listen: $n REQs" ;;
    esac
    # ibcm's server times the same span (REQ received to RTU received): beside the
    # Linux client's figure, a mismatch of what the two sides time shows.
    if [ "$kind" = linux-ibcm ] && [ "$run" = one ]; then
        ROUND_EXTRA="; ibcm listen's own median $(ibcm_establish "$f.server" median) ms"
    fi
    check "$kind $run: a connect time" eval "[ -n '$ms' ]"
}

scenario_cmtime-ibcm() { cm_runs ibcm-ibcm; FIG[cm_ibcm_ibcm_one]="$CM_ONE_MS"; FIG[cm_ibcm_ibcm_many]="$CM_MANY_MS"; }
scenario_cmtime-linux-server() { cm_runs ibcm-linux; FIG[cm_ibcm_linux_one]="$CM_ONE_MS"; FIG[cm_ibcm_linux_many]="$CM_MANY_MS"; }
scenario_cmtime-linux-client() { cm_runs linux-ibcm; FIG[cm_linux_ibcm_one]="$CM_ONE_MS"; FIG[cm_linux_ibcm_many]="$CM_MANY_MS"; }
scenario_cmtime-baseline() {
    cm_pad A
    linux_cm_on A
    cm_runs linux-linux
    FIG[cm_linux_linux_one]="$CM_ONE_MS"
    FIG[cm_linux_linux_many]="$CM_MANY_MS"
}

# The rows of the figures table (data-plane.sh's `row`).
cmtime_figures() {
    local b1="${FIG[cm_linux_linux_one]:-}" bn="${FIG[cm_linux_linux_many]:-}"
    row "cmtime: one at a time, median of $CM_ONE, ms (ibcm -> ibcm / Linux -> Linux)" "${FIG[cm_ibcm_ibcm_one]:-}" "$b1"
    row "cmtime: one at a time, median of $CM_ONE, ms (ibcm -> Linux cmtime -b)" "${FIG[cm_ibcm_linux_one]:-}" "$b1"
    row "cmtime: one at a time, median of $CM_ONE, ms (Linux cmtime -s -> ibcm)" "${FIG[cm_linux_ibcm_one]:-}" "$b1"
    row "cmtime: $CM_MANY connections at once, $CM_ROUNDS_TEXT, ms (ibcm -> ibcm / Linux -> Linux)" "${FIG[cm_ibcm_ibcm_many]:-}" "$bn"
    row "cmtime: $CM_MANY connections at once, $CM_ROUNDS_TEXT, ms (ibcm -> Linux cmtime -b)" "${FIG[cm_ibcm_linux_many]:-}" "$bn"
    row "cmtime: $CM_MANY connections at once, $CM_ROUNDS_TEXT, ms (Linux cmtime -s -> ibcm)" "${FIG[cm_linux_ibcm_many]:-}" "$bn"
    echo "  (cmtime: REQ sent to RTU sent with real RC QPs moved to RTS on both sides; Linux's is"
    echo "  cmtime's connect step, rdma_connect to ESTABLISHED, its address resolution and its QP's"
    echo "  INIT outside it, as ibcm's (printed per scenario). Linux's one-at-a-time"
    echo "  figure is a fresh cmtime process's per connection, ibcm's a warm client's (its first"
    echo "  printed beside it). The guests have one vCPU each: Linux's cmtime client spins on"
    echo "  sched_yield while it waits (cmtime.c:596), taking CPU from its own event thread and rxe.)"
}
