#!/usr/bin/env bash
# The mechanism study's queue (docs/study/mechanism/README.md): the stages one after another, one study
# process at a time at nice 10, each resumable (a rerun skips runs with a result.json), and the run files
# committed on this branch every ~15 minutes and after each stage (an earlier pass's files were lost with
# its machine). Run from the worktree root:
#   nohup nice -n 10 bash docs/study/mechanism/queue.sh > docs/study/mechanism/queue.log 2>&1 &
set -u
cd "$(dirname "$0")/../../.."
PY=${PY:-/work/main/.ci-venv/bin/python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
M=docs/study/mechanism
# stage config, output dir, gate setting ("-": none): a gated stage runs only if that setting's warm start
# is testable (above chance by the breaking margin; python -m epic_slime.study.gate, which also trains it)
STAGES=(
  "$M/stages/1_core_short.yaml $M -"
  "$M/stages/2_core_long.yaml $M long_none"
  "$M/stages/3_secondary_short.yaml $M -"
  "$M/stages/4_secondary_long.yaml $M long_none"
  "configs/study/mechanism_lag.yaml docs/study/mechanism_lag -"
)
# Arguments replace the list (one stage per argument, "config outdir gate"), e.g. to finish only the lag stage
# after a lost machine:  bash docs/study/mechanism/queue.sh "configs/study/mechanism_lag.yaml docs/study/mechanism_lag -"
[ "$#" -gt 0 ] && STAGES=("$@")

commit_runs() {   # only the small files; eval_records.jsonl (per sample) and checkpoints stay out
  local out=$1
  [ -e "$(git rev-parse --git-dir)/index.lock" ] && return 0
  git add -- "$out"/warm_start.json "$out"/provenance.jsonl "$out"/warm_start/*.pt 2>/dev/null
  find "$out/runs" -name result.json 2>/dev/null | while read -r r; do
    d=$(dirname "$r")
    git add -- "$d/result.json" "$d/metrics.jsonl" "$d/eval_metrics.jsonl" "$d/config.json" 2>/dev/null
  done
  git diff --cached --quiet || git commit -q -m "mechanism study: run files as of $(date -u +%H:%M) UTC ($out)" \
    -- "$out" || true
}

for stage in "${STAGES[@]}"; do
  set -- $stage
  config=$1 out=$2 gate=$3
  mkdir -p "$out"
  if [ "$gate" != "-" ]; then
    "$PY" -m epic_slime.study.gate --config "$config" --output-dir "$out" --setting "$gate"
    rc=$?
    commit_runs "$out"
    if [ "$rc" -ne 0 ]; then echo "[queue] $(date -u +%FT%TZ) gate $gate exit $rc: stage $config skipped"; continue; fi
  fi
  echo "[queue] $(date -u +%FT%TZ) stage $config -> $out"
  "$PY" -m epic_slime.cli study --config "$config" --output-dir "$out" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 90); do kill -0 "$pid" 2>/dev/null || break; sleep 10; done
    commit_runs "$out"
  done
  wait "$pid"; echo "[queue] $(date -u +%FT%TZ) stage $config exit $?"
  commit_runs "$out"
done
echo "[queue] $(date -u +%FT%TZ) all stages done"
