#!/usr/bin/env bash
# Re-evaluate a finished run's selected checkpoint(s) with the EPIC authors' 32-sample protocol:
# 32 samples per prompt at temperature 1.0, once with top-p 0.7 and once with top-p 1.0, on
# SGLang's offline engine (one node, tensor parallel), then a Table 1 report per top-p with
# AIME scored over all 32 samples and AMC / HMMT over the first 16 (`report --reeval-protocol`).
#
#   bash launch/reeval.sh --run NAME (--selection report/selection.json | --method M --seed S --steps 120,250) [options] [-- extra evaluate flags]
#
#   --run NAME          RUN            the run (its name in the eval records and in selection.json)
#   --selection FILE    SELECTION      `epic-slime report` selection.json: method, seed and selected step of the run
#   --method M, --seed S, --steps A,B  METHOD, SEED, STEPS   instead of (or to override) the selection
#   --ckpt-pattern P    CKPT_PATTERN   printf pattern of a step's Hugging Face checkpoint folder
#                                      (default /root/checkpoints/<run>_hf/iter_%07d); convert slime's
#                                      Megatron checkpoints to HF first (slime's torch_dist -> HF converter)
#   --data-dir P        DATA_DIR       `epic-slime prepare-data --out` folder (default /root/data)
#   --out-dir P         OUT_DIR        records and reports (default /root/reeval/<run>)
#   --tp-size N         TP_SIZE        tensor-parallel GPUs of the SGLang engine (default 8)
#   --engine E          ENGINE         sglang (default) | transformers (CPU fallback, small models only)
#   --top-ps "A B"      TOP_PS         top-p values, one record file each (default "0.7 1.0")
#   --dry-run           DRY_RUN=1      print the commands only
# Writes OUT_DIR/reeval_topp<P>.jsonl and OUT_DIR/report_topp<P>/ (table1.md with bootstrap intervals).
# An existing record file is an error (evaluate appends; a second pass would duplicate records).
set -euo pipefail

PYTHON="${PYTHON:-python3}"
RUN="${RUN:-}"; SELECTION="${SELECTION:-}"; METHOD="${METHOD:-}"; SEED="${SEED:-}"; STEPS="${STEPS:-}"
CKPT_PATTERN="${CKPT_PATTERN:-}"; DATA_DIR="${DATA_DIR:-/root/data}"; OUT_DIR="${OUT_DIR:-}"
TP_SIZE="${TP_SIZE:-8}"; ENGINE="${ENGINE:-sglang}"; TOP_PS="${TOP_PS:-0.7 1.0}"; DRY_RUN="${DRY_RUN:-0}"
EXTRA_ARGS=()

die() { echo "reeval.sh: error: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --run) need_value "$@"; RUN="$2"; shift 2 ;;
    --selection) need_value "$@"; SELECTION="$2"; shift 2 ;;
    --method) need_value "$@"; METHOD="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --steps) need_value "$@"; STEPS="$2"; shift 2 ;;
    --ckpt-pattern) need_value "$@"; CKPT_PATTERN="$2"; shift 2 ;;
    --data-dir) need_value "$@"; DATA_DIR="$2"; shift 2 ;;
    --out-dir) need_value "$@"; OUT_DIR="$2"; shift 2 ;;
    --tp-size) need_value "$@"; TP_SIZE="$2"; shift 2 ;;
    --engine) need_value "$@"; ENGINE="$2"; shift 2 ;;
    --top-ps) need_value "$@"; TOP_PS="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA_ARGS+=("$@"); break ;;
    *) die "unknown option $1 (evaluate flags go after --)" ;;
  esac
done

[[ -n "${RUN}" ]] || die "--run is required"
if [[ -n "${SELECTION}" ]]; then
  [[ -f "${SELECTION}" ]] || die "--selection file not found: ${SELECTION}"
  # method, seed and step of RUN in the report's selection.json ({method: {run: {seed, step}}})
  read -r SEL_METHOD SEL_SEED SEL_STEP < <("${PYTHON}" - "${SELECTION}" "${RUN}" <<'PY'
import json, sys
path, run = sys.argv[1], sys.argv[2]
found = [(m, v["seed"], v["step"]) for m, runs in json.load(open(path)).items() for r, v in runs.items() if r == run]
if not found:
    sys.exit(f"reeval.sh: error: run {run!r} is not in {path}")
print(*found[0])
PY
  ) || exit 2
  METHOD="${METHOD:-${SEL_METHOD}}"; SEED="${SEED:-${SEL_SEED}}"; STEPS="${STEPS:-${SEL_STEP}}"
fi
[[ -n "${METHOD}" && -n "${SEED}" && -n "${STEPS}" ]] || die "give --selection, or --method, --seed and --steps"
[[ "${SEED}" =~ ^[0-9]+$ ]] || die "--seed must be an integer, got '${SEED}'"
[[ "${TP_SIZE}" =~ ^[1-9][0-9]*$ ]] || die "--tp-size must be a positive integer, got '${TP_SIZE}'"
[[ "${ENGINE}" == sglang || "${ENGINE}" == transformers ]] || die "--engine must be sglang or transformers, got '${ENGINE}'"
IFS=',' read -r -a STEP_LIST <<< "${STEPS}"
for step in "${STEP_LIST[@]}"; do [[ "${step}" =~ ^[0-9]+$ ]] || die "--steps: '${step}' is not a step number"; done
CKPT_PATTERN="${CKPT_PATTERN:-/root/checkpoints/${RUN}_hf/iter_%07d}"
OUT_DIR="${OUT_DIR:-/root/reeval/${RUN}}"

run() { printf '%q ' "$@"; echo; [[ "${DRY_RUN}" == 1 ]] || "$@"; }

[[ "${DRY_RUN}" == 1 ]] || mkdir -p "${OUT_DIR}"
for top_p in ${TOP_PS}; do
  records="${OUT_DIR}/reeval_topp${top_p}.jsonl"
  [[ "${DRY_RUN}" == 1 || ! -e "${records}" ]] || die "${records} exists (remove it to re-evaluate)"
  for step in "${STEP_LIST[@]}"; do
    # shellcheck disable=SC2059
    ckpt="$(printf "${CKPT_PATTERN}" "$((10#${step}))")"
    [[ "${DRY_RUN}" == 1 || -f "${ckpt}/config.json" ]] || \
      die "no Hugging Face checkpoint at ${ckpt} (step ${step}); convert the Megatron checkpoint to HF first"
    engine_args=(--engine "${ENGINE}")
    [[ "${ENGINE}" == sglang ]] && engine_args+=(--tp-size "${TP_SIZE}")
    run "${PYTHON}" -m epic_slime evaluate --model "${ckpt}" --data "${DATA_DIR}" --out "${records}" \
      --run "${RUN}" --method "${METHOD}" --seed "${SEED}" --step "$((10#${step}))" \
      --reeval-protocol --temperature 1.0 --top-p "${top_p}" "${engine_args[@]}" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
  done
  run "${PYTHON}" -m epic_slime report --records "${records}" --reeval-protocol --out "${OUT_DIR}/report_topp${top_p}" --no-plots
done
[[ "${DRY_RUN}" != 1 ]] || echo "# dry run (DRY_RUN=1): nothing was run; the commands above are only printed"
