#!/usr/bin/env bash
# One-GPU smoke run of the slime path: Qwen2.5-0.5B-Instruct with EPIC on the prepared math data,
# SGLang and Megatron colocated on one GPU with the synchronous schedule (--max-staleness 0:
# generate, offload SGLang, train, onload, push), a few rollouts of 8 prompts x 8 samples, one
# evaluation (mean@2 on AIME 24/25, AMC 23, HMMT 25) after the last rollout.
#
#   bash launch/smoke_1gpu.sh [--reuse-ray] [--dry-run] [-- extra driver flags]
#
# Settings (environment variables):
#   METHOD          epic (any configs/methods/M.yaml)
#   HF_CHECKPOINT   /root/models/Qwen2.5-0.5B-Instruct (HF weights; tokenizer and SGLang)
#   REF_LOAD        ${HF_CHECKPOINT}_torch_dist (Megatron torch_dist copy, see docs/cluster.md, "One GPU")
#   DATA_DIR        /root/data (`epic-slime prepare-data --out` folder)
#   SAVE_DIR        /root/checkpoints/<run name> (also --load: a rerun resumes)
#   EVAL_RECORDS    SAVE_DIR/eval_records.jsonl
#   NUM_ROLLOUT     4            UPDATE_DEPTH   2 (optimizer steps per 64-sample batch)
#   SEED            1234 (Megatron's --seed and slime's --rollout-seed)
#   DRY_RUN=1       print the command and validate the project flags; no Ray, no GPU (or --dry-run)
#   REUSE_RAY=1     submit to the Ray cluster already running here (or --reuse-ray)
# Ray: starts a local head, dashboard and job API on 127.0.0.1 only. A Ray cluster already running
# here (`ray status` succeeds) is refused (exit 2), since it may be another run's: pass --reuse-ray
# (REUSE_RAY=1) to submit to it as it is (job API on 127.0.0.1:RAY_DASHBOARD_PORT, default 8265),
# or run `ray stop` first.
# NCCL, set in the job's runtime env: NCCL_NVLS_ENABLE=1 when `nvidia-smi topo -m` shows NVLink
# (NV<n> entries), else 0, as slime's own launch scripts decide (set it to 0 or 1 to override);
# NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME are passed through when set here, left unset otherwise.
set -euo pipefail

REPO_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

METHOD="${METHOD:-epic}"
HF_CHECKPOINT="${HF_CHECKPOINT:-/root/models/Qwen2.5-0.5B-Instruct}"
REF_LOAD="${REF_LOAD:-${HF_CHECKPOINT}_torch_dist}"
DATA_DIR="${DATA_DIR:-/root/data}"
NUM_ROLLOUT="${NUM_ROLLOUT:-4}"
UPDATE_DEPTH="${UPDATE_DEPTH:-2}"
SEED="${SEED:-1234}"
WANDB_PROJECT="${WANDB_PROJECT:-epic-slime}"
DRY_RUN="${DRY_RUN:-0}"
DRY_RUN_ASKED=""   # "--dry-run" when the flag asked for the dry run (the footer says how to submit)
REUSE_RAY="${REUSE_RAY:-0}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
MEGATRON_PATH="${MEGATRON_PATH:-/root/Megatron-LM}"
EXTRA_ARGS=()

die() { echo "smoke_1gpu.sh: error: $*" >&2; exit 2; }
. "${REPO_DIR}/launch/_submit.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --reuse-ray) REUSE_RAY=1; shift ;;
    --dry-run) DRY_RUN=1; DRY_RUN_ASKED="--dry-run"; shift ;;
    -h|--help) print_header "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; EXTRA_ARGS+=("$@"); break ;;
    *) die "unknown option $1 (settings are environment variables; driver flags go after --)" ;;
  esac
done

for pair in "NUM_ROLLOUT:${NUM_ROLLOUT}" "UPDATE_DEPTH:${UPDATE_DEPTH}" "SEED:${SEED}"; do
  [[ "${pair#*:}" =~ ^[0-9]+$ ]] || die "${pair%%:*} must be a non-negative integer, got '${pair#*:}'"
done
[[ "${NUM_ROLLOUT}" -ge 1 ]] || die "NUM_ROLLOUT must be >= 1, got ${NUM_ROLLOUT}"
METHOD_CONFIG="${REPO_DIR}/configs/methods/${METHOD}.yaml"
[[ -f "${METHOD_CONFIG}" ]] || die "unknown method '${METHOD}' (no ${METHOD_CONFIG})"

RUN_NAME="smoke-qwen2.5-0.5b-${METHOD}-d${UPDATE_DEPTH}-s${SEED}"
SAVE_DIR="${SAVE_DIR:-/root/checkpoints/${RUN_NAME}}"
EVAL_RECORDS="${EVAL_RECORDS:-${SAVE_DIR}/eval_records.jsonl}"
RUN_CONFIG="${SAVE_DIR}/epic_run.yaml"   # the run identity (run_config_yaml), next to the checkpoints

# The paper's shared settings, the small model, the method, then the smoke scale (later files win).
read_config_args configs/paper/table2.yaml configs/models/qwen2.5_0.5b.yaml "${METHOD_CONFIG}" configs/smoke/one_gpu.yaml

shared_driver_args   # EVAL_DATA_ARGS, WANDB_ARGS

DRIVER_ARGS=(
  --actor-num-nodes 1
  --actor-num-gpus-per-node 1
  --rollout-num-gpus 1
  --num-gpus-per-node 1
  --hf-checkpoint "${HF_CHECKPOINT}"
  --ref-load "${REF_LOAD}"
  --load "${SAVE_DIR}"
  --save "${SAVE_DIR}"
  --prompt-data "${DATA_DIR}/train/dapo_math_17k.jsonl"
  "${EVAL_DATA_ARGS[@]}"
  --custom-config-path "${RUN_CONFIG}"
  --num-rollout "${NUM_ROLLOUT}"
  --eval-interval "${NUM_ROLLOUT}"
  --seed "${SEED}"
  --rollout-seed "${SEED}"
  "${CONFIG_ARGS[@]}"
  --update-depth "${UPDATE_DEPTH}"
  --max-staleness 0
  "${WANDB_ARGS[@]}"
  "${EXTRA_ARGS[@]}"
)

dry_run_or_check_flags

if ! reuse_running_ray; then
  ray start --head --node-ip-address 127.0.0.1 --num-gpus 1 --disable-usage-stats \
    --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT}"
fi
gpus=$(ray status 2>/dev/null | awk '/GPU/ {split($1, a, "/"); print int(a[2]); exit}')
[[ "${gpus:-0}" -ge 1 ]] || die "the Ray cluster has no GPU"
submit_job
