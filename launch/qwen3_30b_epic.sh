#!/usr/bin/env bash
# The paper's run: Qwen3-30B-A3B-Base on DAPO-Math-17K with EPIC (or any Table 1 method) on a
# Ray cluster, 4 nodes x 8 GPUs by default, through the asynchronous slime driver
# `python -m epic_slime.slime.train`.
#
#   bash launch/qwen3_30b_epic.sh [options] [-- extra driver flags]
#
# Every setting is an environment variable, and most also a flag (flags win):
#   --method M          METHOD           epic | grpo | dapo | gspo | ctpo | ripo | grpo_r2 | grpo_r3, or any other configs/methods/M.yaml
#   --nodes N           NUM_NODES        nodes in the Ray cluster (default 4)
#   --gpus-per-node G   GPUS_PER_NODE    GPUs per node, for training and for slime's engine placement (default 8)
#   --layout L          LAYOUT           colocate | split (default: colocate at K = 0, split at K >= 1). colocate:
#                                        Megatron and SGLang share every GPU (slime's --colocate, which offloads
#                                        each while the other runs), as the paper's and verl's synchronous
#                                        baselines do; only the synchronous schedule (K = 0) can share GPUs.
#                                        split: ACTOR_NODES nodes train, the rest run SGLang.
#   --actor-nodes A     ACTOR_NODES      split layout: nodes for Megatron training; the rest run SGLang (default: the
#                                        planner's pick for NUM_NODES x GPUS_PER_NODE at K >= 1, NUM_NODES / 2 at
#                                        K = 0 or when bench/schedsim/launch_predictions.json has no pick)
#   --gpus-per-engine E GPUS_PER_ENGINE  GPUs per SGLang engine (default: the planner's pick, else 8)
#   --push-mode M       PUSH_MODE        weight push: abort | in_place (--weight-push-mode; default abort)
#   --oversample-ratio R OVERSAMPLE_RATIO oversampling at K >= 2 (default 0: the staleness budget alone decides
#                                        what starts; Table 2's 0.1 caps the groups in flight at 72)
#   --update-depth D    UPDATE_DEPTH     optimizer steps per rollout batch (default 8)
#   --max-staleness K   MAX_STALENESS    staleness bound in weight updates (default 2; "none" = unbounded)
#   --stale-policy P    STALE_POLICY     drop | keep (default drop)
#   --seed S            SEED             Megatron's --seed and slime's --rollout-seed (prompt order, sampling) (default 1234)
#   --num-rollout R     NUM_ROLLOUT      training steps (default 300)
#   --hf-checkpoint P   HF_CHECKPOINT    HF weights (default /root/models/Qwen3-30B-A3B-Base)
#   --ref-load P        REF_LOAD         Megatron torch_dist weights (default ${HF_CHECKPOINT}_torch_dist)
#   --save-dir P        SAVE_DIR         checkpoints / resume (default /root/checkpoints/<run name>)
#   --data-dir P        DATA_DIR         `epic-slime prepare-data --out` folder (default /root/data):
#                                        train/dapo_math_17k.jsonl, eval/{aime_2024,aime_2025,amc_2023,hmmt_feb_2025}.jsonl
#                       EVAL_RECORDS     per-sample eval records for the Table 1 report (default SAVE_DIR/eval_records.jsonl)
#   --wandb-project P   WANDB_PROJECT    W&B project; W&B is on when WANDB_API_KEY is set (never printed)
#                       ASYNC_SAVE=1     Megatron writes checkpoints in the background (--async-save; docs/cluster.md, "Checkpoints")
#   --reuse-ray         REUSE_RAY=1      submit to (or, as a worker, stay in) the Ray cluster already running here
#   --dry-run           DRY_RUN=1        print the full command and validate the project flags; no Ray, no GPUs;
#                                        also prints the simulator's s/rollout and speedup for these settings
# Ray: RAY_ROLE=head (default) starts a head on this node, dashboard and job API bound to 127.0.0.1
# only; RAY_ROLE=worker HEAD_ADDR=<ip> joins this node to the head and exits. A Ray cluster already
# running on this node (`ray status` succeeds) is refused (exit 2), since it may be another run's,
# with other nodes, GPUs or environment: pass --reuse-ray (REUSE_RAY=1) to submit to it as it is
# (its job API must listen on 127.0.0.1:RAY_DASHBOARD_PORT, default 8265), or run `ray stop` first.
# NCCL, set in the job's runtime env: NCCL_NVLS_ENABLE=1 when `nvidia-smi topo -m` on this node
# shows NVLink (NV<n> entries), else 0, as slime's own launch scripts decide (set NCCL_NVLS_ENABLE=0
# or 1 to override); NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME are passed through when set here
# (e.g. eth0 or ^lo,docker0) and left unset otherwise, so NCCL and Gloo pick an interface themselves.
set -euo pipefail

REPO_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

METHOD="${METHOD:-epic}"
NUM_NODES="${NUM_NODES:-4}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
ACTOR_NODES="${ACTOR_NODES:-}"
GPUS_PER_ENGINE="${GPUS_PER_ENGINE:-}"
PUSH_MODE="${PUSH_MODE:-abort}"
OVERSAMPLE_RATIO="${OVERSAMPLE_RATIO:-0}"
UPDATE_DEPTH="${UPDATE_DEPTH:-8}"
MAX_STALENESS="${MAX_STALENESS:-2}"
LAYOUT="${LAYOUT:-}"
STALE_POLICY="${STALE_POLICY:-drop}"
SEED="${SEED:-1234}"
NUM_ROLLOUT="${NUM_ROLLOUT:-300}"
HF_CHECKPOINT="${HF_CHECKPOINT:-/root/models/Qwen3-30B-A3B-Base}"
REF_LOAD="${REF_LOAD:-}"
SAVE_DIR="${SAVE_DIR:-}"
DATA_DIR="${DATA_DIR:-/root/data}"
WANDB_PROJECT="${WANDB_PROJECT:-epic-slime}"
DRY_RUN="${DRY_RUN:-0}"
DRY_RUN_ASKED=""   # "--dry-run" when the flag asked for the dry run (the footer says how to submit)
REUSE_RAY="${REUSE_RAY:-0}"
RAY_ROLE="${RAY_ROLE:-head}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
MEGATRON_PATH="${MEGATRON_PATH:-/root/Megatron-LM}"
EXTRA_ARGS=()

die() { echo "qwen3_30b_epic.sh: error: $*" >&2; exit 2; }
. "${REPO_DIR}/launch/_submit.sh"
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --method) need_value "$@"; METHOD="$2"; shift 2 ;;
    --nodes) need_value "$@"; NUM_NODES="$2"; shift 2 ;;
    --gpus-per-node) need_value "$@"; GPUS_PER_NODE="$2"; shift 2 ;;
    --layout) need_value "$@"; LAYOUT="$2"; shift 2 ;;
    --actor-nodes) need_value "$@"; ACTOR_NODES="$2"; shift 2 ;;
    --gpus-per-engine) need_value "$@"; GPUS_PER_ENGINE="$2"; shift 2 ;;
    --push-mode) need_value "$@"; PUSH_MODE="$2"; shift 2 ;;
    --oversample-ratio) need_value "$@"; OVERSAMPLE_RATIO="$2"; shift 2 ;;
    --update-depth) need_value "$@"; UPDATE_DEPTH="$2"; shift 2 ;;
    --max-staleness) need_value "$@"; MAX_STALENESS="$2"; shift 2 ;;
    --stale-policy) need_value "$@"; STALE_POLICY="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --num-rollout) need_value "$@"; NUM_ROLLOUT="$2"; shift 2 ;;
    --hf-checkpoint) need_value "$@"; HF_CHECKPOINT="$2"; shift 2 ;;
    --ref-load) need_value "$@"; REF_LOAD="$2"; shift 2 ;;
    --save-dir) need_value "$@"; SAVE_DIR="$2"; shift 2 ;;
    --data-dir) need_value "$@"; DATA_DIR="$2"; shift 2 ;;
    --wandb-project) need_value "$@"; WANDB_PROJECT="$2"; shift 2 ;;
    --reuse-ray) REUSE_RAY=1; shift ;;
    --dry-run) DRY_RUN=1; DRY_RUN_ASKED="--dry-run"; shift ;;
    -h|--help) print_header "${BASH_SOURCE[0]}"; exit 0 ;;
    --) shift; EXTRA_ARGS+=("$@"); break ;;
    *) die "unknown option $1 (driver flags go after --)" ;;
  esac
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
for pair in "NUM_NODES:${NUM_NODES}" "GPUS_PER_NODE:${GPUS_PER_NODE}" "UPDATE_DEPTH:${UPDATE_DEPTH}" \
            "SEED:${SEED}" "NUM_ROLLOUT:${NUM_ROLLOUT}"; do
  is_uint "${pair#*:}" || die "${pair%%:*} must be a non-negative integer, got '${pair#*:}'"
done
[[ "${PUSH_MODE}" == abort || "${PUSH_MODE}" == in_place ]] || die "PUSH_MODE must be abort or in_place, got '${PUSH_MODE}'"
# The layout: the synchronous schedule shares the GPUs by default (nothing generates while Megatron
# trains, so a split would leave half the GPUs idle at every step); the asynchronous one cannot.
if [[ -z "${LAYOUT}" ]]; then
  if [[ "${MAX_STALENESS}" == 0 ]]; then LAYOUT=colocate; else LAYOUT=split; fi
fi
case "${LAYOUT}" in
  colocate)
    [[ "${MAX_STALENESS}" == 0 ]] || die "LAYOUT=colocate needs the synchronous schedule (MAX_STALENESS=0): with \
MAX_STALENESS=${MAX_STALENESS} SGLang generates while Megatron trains, so they cannot share GPUs; use --layout split"
    [[ -z "${ACTOR_NODES}" ]] || die "ACTOR_NODES=${ACTOR_NODES} sets the split layout's training nodes, but the layout \
is colocate (every node trains and generates): add --layout split, or drop ACTOR_NODES"
    [[ "${PUSH_MODE}" == abort ]] || die "PUSH_MODE=in_place needs separate rollout GPUs; colocated, nothing generates \
during a push: use --push-mode abort or --layout split" ;;
  split)
    [[ "${NUM_NODES}" -ge 2 ]] || die "NUM_NODES must be >= 2 for the split layout (training and generation on separate \
nodes), got ${NUM_NODES}" ;;
  *) die "LAYOUT must be colocate or split, got '${LAYOUT}'" ;;
esac
[[ "${OVERSAMPLE_RATIO}" =~ ^0(\.[0-9]+)?$ ]] || die "OVERSAMPLE_RATIO must be a number in [0, 1), got '${OVERSAMPLE_RATIO}'"
# The planner's pick (python bench/schedule_sim.py plan; precomputed per node count in
# bench/schedsim/launch_predictions.json) for the split and the engine size of an asynchronous run.
PLAN_NOTE="ACTOR_NODES / GPUS_PER_ENGINE as given"
if [[ "${LAYOUT}" == colocate ]]; then
  ACTOR_NODES="${NUM_NODES}"
  if [[ -z "${GPUS_PER_ENGINE}" ]]; then   # the sync colocated best engine size, as the simulator prices it
    PICK=$("${PYTHON}" "${REPO_DIR}/bench/schedule_sim.py" pick --k 0 --nodes "${NUM_NODES}" --gpus-per-node "${GPUS_PER_NODE}" 2>/dev/null || true)
    GPUS_PER_ENGINE="${PICK#* }"; GPUS_PER_ENGINE="${GPUS_PER_ENGINE:-8}"
  fi
  PLAN_NOTE="colocated (--layout split for separate train and SGLang nodes): all ${NUM_NODES} nodes train and generate, ${GPUS_PER_ENGINE} GPUs per engine"
elif [[ -z "${ACTOR_NODES}" || -z "${GPUS_PER_ENGINE}" ]]; then
  PICK=""
  if [[ "${MAX_STALENESS}" != 0 ]]; then
    PICK=$("${PYTHON}" "${REPO_DIR}/bench/schedule_sim.py" pick --nodes "${NUM_NODES}" --gpus-per-node "${GPUS_PER_NODE}" 2>/dev/null || true)
  fi
  if [[ -n "${PICK}" ]]; then
    ACTOR_NODES="${ACTOR_NODES:-${PICK% *}}"; GPUS_PER_ENGINE="${GPUS_PER_ENGINE:-${PICK#* }}"
    PLAN_NOTE="the planner's pick for ${NUM_NODES} x ${GPUS_PER_NODE} GPUs: ${PICK% *} train node(s), ${PICK#* } GPUs per engine"
  else
    ACTOR_NODES="${ACTOR_NODES:-$(( NUM_NODES / 2 ))}"; GPUS_PER_ENGINE="${GPUS_PER_ENGINE:-8}"
    PLAN_NOTE="no planner pick (K = 0, or none precomputed for ${NUM_NODES} x ${GPUS_PER_NODE}): half the nodes train, 8 GPUs per engine"
  fi
fi
is_uint "${GPUS_PER_ENGINE}" && [[ "${GPUS_PER_ENGINE}" -ge 1 ]] || die "GPUS_PER_ENGINE must be a positive integer, got '${GPUS_PER_ENGINE}'"
is_uint "${ACTOR_NODES}" || die "ACTOR_NODES must be an integer, got '${ACTOR_NODES}'"
if [[ "${LAYOUT}" == colocate ]]; then
  ROLLOUT_GPUS=$(( NUM_NODES * GPUS_PER_NODE ))   # the same GPUs as training
  LAYOUT_ARGS=(--colocate)                         # slime: implies --offload-train and --offload-rollout
else
  [[ "${ACTOR_NODES}" -ge 1 && "${ACTOR_NODES}" -lt "${NUM_NODES}" ]] \
    || die "ACTOR_NODES=${ACTOR_NODES} must leave at least one of NUM_NODES=${NUM_NODES} nodes for SGLang"
  ROLLOUT_GPUS=$(( (NUM_NODES - ACTOR_NODES) * GPUS_PER_NODE ))
  LAYOUT_ARGS=()
fi

METHOD_CONFIG="${REPO_DIR}/configs/methods/${METHOD}.yaml"
if [[ ! -f "${METHOD_CONFIG}" ]]; then
  available=$(cd "${REPO_DIR}/configs/methods" && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')
  die "unknown method '${METHOD}'; available: ${available}"
fi
REF_LOAD="${REF_LOAD:-${HF_CHECKPOINT}_torch_dist}"
RUN_NAME="qwen3-30b-a3b-${METHOD}-d${UPDATE_DEPTH}-k${MAX_STALENESS}-s${SEED}"
SAVE_DIR="${SAVE_DIR:-/root/checkpoints/${RUN_NAME}}"
EVAL_RECORDS="${EVAL_RECORDS:-${SAVE_DIR}/eval_records.jsonl}"
RUN_CONFIG="${SAVE_DIR}/epic_run.yaml"   # the run identity (run_config_yaml), next to the checkpoints

# Settings from YAML: the paper's shared settings (Table 2), the model and its parallelism,
# then the method (its clip parameters and any routing-replay flags). The flags this script sets
# itself are left out of them, so the command passes each once (a repeat is the user's own override).
OWN_FLAGS=(--omit rollout-num-gpus-per-engine)
if [[ "${MAX_STALENESS}" != 0 && "${MAX_STALENESS}" != 1 ]]; then OWN_FLAGS+=(--omit oversample-ratio); fi
read_config_args "${OWN_FLAGS[@]}" configs/paper/table2.yaml configs/models/qwen3_30b_a3b.yaml "${METHOD_CONFIG}"

STALENESS_ARGS=(--stale-policy "${STALE_POLICY}")
if [[ "${MAX_STALENESS}" != "none" ]]; then
  is_uint "${MAX_STALENESS}" || die "MAX_STALENESS must be a non-negative integer or 'none', got '${MAX_STALENESS}'"
  STALENESS_ARGS+=(--max-staleness "${MAX_STALENESS}")
fi

shared_driver_args   # EVAL_DATA_ARGS, WANDB_ARGS

# At K >= 2 the planner's oversampling (0 by default) replaces Table 2's 0.1: under the staleness budget
# the groups in flight are what the budget admits, and a cap of 72 would hold them at one batch and a bit.
OVERSAMPLE_ARGS=()
if [[ "${MAX_STALENESS}" != 0 && "${MAX_STALENESS}" != 1 ]]; then
  OVERSAMPLE_ARGS=(--oversample-ratio "${OVERSAMPLE_RATIO}")
fi

# DRY_RUN=1: the simulator's price of these settings (bench/schedsim/launch_predictions.json, precomputed),
# at the oversampling the printed command submits: the last --oversample-ratio it passes (Table 2's 0.1
# from the config at K = 0 and 1, the launcher's own at K >= 2, or the user's after --); at K = 0 also the
# other layout's. A colocated layout is priced as ACTOR_NODES = NUM_NODES (every node trains).
price_line() {  # $1 = train nodes, $2 = GPUs per engine
  local over=0 i
  for (( i = 0; i + 1 < ${#DRIVER_ARGS[@]}; i++ )); do
    [[ "${DRIVER_ARGS[i]}" == --oversample-ratio ]] && over="${DRIVER_ARGS[i + 1]}"
  done
  "${PYTHON}" "${REPO_DIR}/bench/schedule_sim.py" predict --nodes "${NUM_NODES}" --gpus-per-node "${GPUS_PER_NODE}" \
    --actor-nodes "$1" --gpus-per-engine "$2" --k "${MAX_STALENESS}" \
    --push-mode "${PUSH_MODE}" --oversample-ratio "${over}" 2>&1 | head -1 || true
}
dry_run_price() {
  echo "# layout and engine size: ${PLAN_NOTE}"
  echo "# price of this command (${LAYOUT}):"
  price_line "${ACTOR_NODES}" "${GPUS_PER_ENGINE}"
  if [[ "${MAX_STALENESS}" == 0 ]]; then
    if [[ "${LAYOUT}" == colocate ]]; then
      echo "# the split layout instead (--layout split: $(( NUM_NODES / 2 )) train node(s), 8 GPUs per engine):"
      price_line "$(( NUM_NODES / 2 ))" 8
    else
      echo "# the colocated layout instead (--layout colocate: all ${NUM_NODES} nodes, ${GPUS_PER_ENGINE} GPUs per engine):"
      price_line "${NUM_NODES}" "${GPUS_PER_ENGINE}"
    fi
  fi
}

DRIVER_ARGS=(
  --actor-num-nodes "${ACTOR_NODES}"
  --actor-num-gpus-per-node "${GPUS_PER_NODE}"
  --num-gpus-per-node "${GPUS_PER_NODE}"
  --rollout-num-gpus "${ROLLOUT_GPUS}"
  "${LAYOUT_ARGS[@]}"
  --hf-checkpoint "${HF_CHECKPOINT}"
  --ref-load "${REF_LOAD}"
  --load "${SAVE_DIR}"
  --save "${SAVE_DIR}"
  --prompt-data "${DATA_DIR}/train/dapo_math_17k.jsonl"
  "${EVAL_DATA_ARGS[@]}"
  --custom-config-path "${RUN_CONFIG}"
  --num-rollout "${NUM_ROLLOUT}"
  --seed "${SEED}"
  --rollout-seed "${SEED}"
  "${CONFIG_ARGS[@]}"
  --update-depth "${UPDATE_DEPTH}"
  "${STALENESS_ARGS[@]}"
  --rollout-num-gpus-per-engine "${GPUS_PER_ENGINE}"
  --weight-push-mode "${PUSH_MODE}"
  "${OVERSAMPLE_ARGS[@]}"
  "${WANDB_ARGS[@]}"
  "${EXTRA_ARGS[@]}"
)
if [[ "${ASYNC_SAVE:-0}" == 1 ]]; then DRIVER_ARGS+=(--async-save); fi

dry_run_or_check_flags

# ---- Ray: join or start (a running cluster only with --reuse-ray), local-only dashboard / job API ----
if [[ "${RAY_ROLE}" == "worker" ]]; then
  [[ -n "${HEAD_ADDR:-}" ]] || die "RAY_ROLE=worker needs HEAD_ADDR=<head node ip>"
  reuse_running_ray && exit 0   # already in a cluster and asked to stay: nothing to start
  ray start --address "${HEAD_ADDR}:6379" --num-gpus "${GPUS_PER_NODE}" --disable-usage-stats
  exit 0
fi
[[ "${RAY_ROLE}" == "head" ]] || die "RAY_ROLE must be head or worker, got '${RAY_ROLE}'"
if ! reuse_running_ray; then
  ray start --head --node-ip-address "${MASTER_ADDR:-$(hostname -I | awk '{print $1}')}" \
    --num-gpus "${GPUS_PER_NODE}" --disable-usage-stats \
    --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT}"
fi
# Wait (up to WAIT_NODES_S seconds) until every node has joined.
deadline=$(( SECONDS + ${WAIT_NODES_S:-600} ))
while :; do
  gpus=$(ray status 2>/dev/null | awk '/GPU/ {split($1, a, "/"); print int(a[2]); exit}')
  [[ "${gpus:-0}" -ge $(( NUM_NODES * GPUS_PER_NODE )) ]] && break
  [[ ${SECONDS} -lt ${deadline} ]] || die "the Ray cluster has ${gpus:-0} GPUs, expected $(( NUM_NODES * GPUS_PER_NODE )) (start the workers with RAY_ROLE=worker HEAD_ADDR=...)"
  sleep 10
done

submit_job
