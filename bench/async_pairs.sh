#!/usr/bin/env bash
# The embedded runtime's async/sync ratio, this tree against an older commit, interleaved (old, new, old, new, ...)
# so that a change in the machine's load hits both alike (issue 34). Each half is `bench/async_bench.py` of its own
# tree; the log keeps each run's lines and the load average at its start; `python bench/async_pairs.py LOG` prints the
# medians and the paired differences.
#   bash bench/async_pairs.sh [OLD_COMMIT=69105eb] [PAIRS=3] [STEPS=20] > bench/async_pairs.log
# Run it on an idle machine: the ratio is a wall-clock one (async overlaps its workers on the 2 cores).
set -eu
OLD=${1:-69105eb} PAIRS=${2:-3} STEPS=${3:-20}
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$NEW/.ci-venv/bin/python}
OLD_TREE=$(mktemp -d /tmp/epic_slime_old_XXXX)
git -C "$NEW" worktree add --detach "$OLD_TREE" "$OLD" >/dev/null 2>&1
trap 'git -C "$NEW" worktree remove --force "$OLD_TREE"' EXIT
echo "# old $(git -C "$OLD_TREE" rev-parse --short HEAD), new $(git -C "$NEW" rev-parse --short HEAD), $STEPS steps"
for i in $(seq "$PAIRS"); do
  for t in old new; do
    d=$NEW; [ "$t" = old ] && d=$OLD_TREE
    echo "== pair $i $t $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$d" && PYTHONPATH=$d "$PY" bench/async_bench.py --steps "$STEPS" --output-dir "$(mktemp -d)" 2>&1 \
       | grep -E '^(async|sync|async /)')
  done
done
