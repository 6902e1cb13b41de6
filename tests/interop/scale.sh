#!/usr/bin/env bash
# Connection setup at scale on the two soft-RoCE guests: COUNT connections at once (default
# 500, rdma-core cmtime's -c) in every role, with a real RC QP moved to RTS for each:
#
#   tests/interop/scale.sh [COUNT]        (as root)
#
#   ibcm cmtime -> ibcm listen, ibcm cmtime -> Linux cmtime -b, Linux cmtime -s -> ibcm
#   listen, and Linux -> Linux on the same guests for the baseline
#
# data-plane.sh's cmtime scenarios (data-plane-cmtime.sh) with IBCM_DP_CM_MANY=COUNT: each
# checks that every connection was established and served and that both sides exit 0, and
# prints the time for all COUNT beside Linux's. Three one-at-a-time connections each
# (their figures are data-plane.sh's own run). Bounded: the whole run is cut at
# IBCM_SCALE_TIMEOUT seconds (default 600).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
count="${1:-500}"
case "$count" in
    '' | *[!0-9]*) echo "scale: COUNT must be a number, not '$count'" >&2; exit 2 ;;
esac
# One round of COUNT at once (data-plane.sh's figure is a median of several rounds of 20).
export IBCM_DP_CM_MANY="$count" IBCM_DP_CM_ONE="${IBCM_DP_CM_ONE:-3}" IBCM_DP_CM_ROUNDS="${IBCM_DP_CM_ROUNDS:-1}"
export IBCM_DP_OUT="${IBCM_DP_OUT:-$here/../../target/interop/scale-$count}"
echo "scale: $count connections at once in each role (data-plane.sh's cmtime scenarios)"
exec timeout "${IBCM_SCALE_TIMEOUT:-600}" bash "$here/data-plane.sh" \
    cmtime-ibcm cmtime-linux-server cmtime-linux-client cmtime-baseline
