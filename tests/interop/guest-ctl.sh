# The harness's side of a guest's control line (sourced by run.sh and data-plane.sh; the
# guest's side is guest-init.sh).
#
# ctl_run WRITE_FD READ_FD TIMEOUT COMMAND WHO: runs COMMAND in the guest's shell, prints
# its output and returns its status (124 if no answer within TIMEOUT seconds of silence;
# WHO names the guest in that message). The command goes as "@@CMD LENGTH COMMAND": one the
# guest received with its head lost (seen after a background job is killed on a loaded
# host) is refused unrun (@@GARBLED) and sent again, twice at most.
ctl_run() {
    local line rc="" garbled try
    for try in 1 2 3; do
        printf '@@CMD %s %s\n' "${#4}" "$4" >&"$1"
        garbled=""
        while IFS= read -r -t "$3" line <&"$2"; do
            case "$line" in
                *@@GARBLED*) garbled=1; break ;;
                *@@RC\ *) rc="${line##*@@RC }"; break ;;
            esac
            [ -n "$line" ] && printf '%s\n' "$line"
        done
        [ -n "$garbled" ] || break
        echo "$5 received a garbled command (try $try); sending it again" >&2
    done
    [ -n "$rc" ] || { echo "no answer from $5 within $3 s to: $4" >&2; return 124; }
    return "$rc"
}
