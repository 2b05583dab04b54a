#!/usr/bin/env bash
# Shared by launch/table1/<row>.sh: run one Table 1 row with the paper's protocol by default.
#
#   bash launch/table1/_paper_protocol.sh <method> [launch/qwen3_30b_epic.sh options] [-- driver flags]
#
# The paper's protocol (Section 9.3, Table 2): the synchronous schedule (MAX_STALENESS=0: rollout r
# is generated with the policy trained on rollout r - 1, no cross-step buffer) with update depth 8
# (UPDATE_DEPTH=8: each 64 x 8 batch split into 8 sequential optimizer steps) and the settings of
# configs/paper/table2.yaml. ASYNC=1 runs the asynchronous variant of the same row instead
# (launch/qwen3_30b_epic.sh's default bound, MAX_STALENESS=2 unless set); --max-staleness K on the
# command line wins over both.
# Rows run one after another on one Ray cluster need --reuse-ray (REUSE_RAY=1): launch/qwen3_30b_epic.sh
# refuses a cluster already running unless asked (or run `ray stop` between rows for a fresh one).
set -euo pipefail

[[ $# -ge 1 && -n "$1" ]] || { echo "table1: error: usage: _paper_protocol.sh <method> [options]" >&2; exit 2; }
ROW_METHOD="$1"; shift
case "${ASYNC:-0}" in
  0) export MAX_STALENESS="${MAX_STALENESS:-0}" ;;
  1) if [[ "${MAX_STALENESS:-}" == "0" ]]; then
       echo "table1: error: ASYNC=1 asks for the asynchronous schedule, but MAX_STALENESS=0 is the synchronous one" >&2
       exit 2
     fi ;;
  *) echo "table1: error: ASYNC must be 0 (the paper's synchronous protocol) or 1 (asynchronous), got '${ASYNC}'" >&2
     exit 2 ;;
esac
export UPDATE_DEPTH="${UPDATE_DEPTH:-8}"
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/../qwen3_30b_epic.sh" --method "${ROW_METHOD}" "$@"
