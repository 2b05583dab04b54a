#!/usr/bin/env bash
# The ratio-base study's queue (issue 47 item 4; design: README.md here, fixed before any run); as ../mismatch_graded/queue.sh. One study process
# at a time, the stages in order; resumable: a rerun skips every run that has a result.json, so after a lost
# machine or a session's end the same command continues where it stopped. It commits the run files (small ones
# only; no checkpoints, no per-sample eval records) on this branch about every 10 minutes and after each stage,
# with the regenerated report, so nothing finished is lost. Run from the worktree root:
#   nohup nice -n 19 bash docs/study/mismatch_base/queue.sh > /tmp/logs/mismatch_base_queue.log 2>&1 &
set -u
cd "$(dirname "$0")/../../.."
PY=${PY:-/work/main/.ci-venv/bin/python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=docs/study/mismatch_base
CONFIG=configs/study/mismatch_base.yaml
STAGES=("$CONFIG")
[ "$#" -gt 0 ] && STAGES=("$@")

commit_runs() {
  [ -e "$(git rev-parse --git-dir)/index.lock" ] && return 0
  "$PY" -m epic_slime.cli study --config "$CONFIG" --output-dir "$OUT" --analyze-only > /dev/null 2>&1 || true
  git add -- "$OUT"/warm_start.json "$OUT"/provenance.jsonl "$OUT"/study.md "$OUT"/summary.json "$OUT"/*.png 2>/dev/null
  find "$OUT/runs" -name result.json 2>/dev/null | while read -r r; do
    d=$(dirname "$r")
    # -f: runs/ is ignored repository-wide (a user's runs); a study's run files are its record
    git add -f -- "$d/result.json" "$d/metrics.jsonl" "$d/eval_metrics.jsonl" "$d/config.json" 2>/dev/null
  done
  git diff --cached --quiet -- "$OUT" || git commit -q -m "ratio-base study: run files as of $(date -u +%H:%M) UTC" -- "$OUT" || true
}

for config in "${STAGES[@]}"; do
  echo "[queue] $(date -u +%FT%TZ) stage $config -> $OUT"
  "$PY" -m epic_slime.cli study --config "$config" --output-dir "$OUT" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 10; done
    commit_runs
  done
  wait "$pid"; status=$?
  echo "[queue] $(date -u +%FT%TZ) stage $config exit $status"
  commit_runs
  # a stage that failed (e.g. Ray did not start on a loaded machine) stops the queue: the stages run in order
  [ "$status" -eq 0 ] || { echo "[queue] stopped: stage $config failed"; exit "$status"; }
done
echo "[queue] $(date -u +%FT%TZ) all stages done"
