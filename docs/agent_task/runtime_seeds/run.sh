#!/usr/bin/env bash
# The calc agent on the runtime's own loop, seeds 1-3 (fixed before the runs), each the README's agent command
# with --seed. Keeps the small end-of-run files here (docs/results.md's "agent_runtime" table reads them);
# checkpoints and per-sample records stay in the scratch folder. Run from the repository root:
#   bash docs/agent_task/runtime_seeds/run.sh [scratch folder, default /tmp/agentseeds]
set -euo pipefail
HERE=docs/agent_task/runtime_seeds
SCRATCH=${1:-/tmp/agentseeds}
for seed in 1 2 3; do
  out="$SCRATCH/s$seed"
  rm -rf "$out"; mkdir -p "$SCRATCH"
  epic-slime train --config configs/local/agent_calc.yaml --seed "$seed" --output-dir "$out" --no-progress --no-plots \
    > "$SCRATCH/s$seed.log" 2>&1
  mkdir -p "$HERE/s$seed"
  cp "$out"/{config.json,summary.json,eval_metrics.jsonl} "$HERE/s$seed/"
  grep -A8 "^epic-slime train:" "$SCRATCH/s$seed.log" > "$HERE/s$seed/run.log"
done
python bench/make_results.py
