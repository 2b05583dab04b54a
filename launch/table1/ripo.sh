#!/usr/bin/env bash
# Paper Table 1 row "ripo" (configs/methods/ripo.yaml) on the default 4 x 8 GPU cluster; every
# setting of launch/qwen3_30b_epic.sh can still be overridden (environment or flags).
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/../qwen3_30b_epic.sh" --method ripo "$@"
