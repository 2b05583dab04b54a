# Sourced by the launchers (launch/qwen3_30b_epic.sh, launch/smoke_1gpu.sh) once REPO_DIR, PYTHON
# and die are set: the run setup, the cluster settings and the Ray job submission they share. The
# functions read the launcher's settings when called (RUN_NAME, METHOD, EVAL_RECORDS, DATA_DIR,
# WANDB_PROJECT, DRIVER_ARGS, MEGATRON_PATH, RAY_DASHBOARD_PORT, RUN_CONFIG, SAVE_DIR, DRY_RUN,
# REUSE_RAY). The job API is addressed on 127.0.0.1 only.

# --help: the launcher's header comment (every line from the second up to the first non-comment).
print_header() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"
}

# ---- cluster settings: NVLS, socket interfaces, a Ray cluster already running ----

# Validates REUSE_RAY and the caller's NCCL / Gloo variables, and sets JOB_NVLS (the job's
# NCCL_NVLS_ENABLE) and NVLS_REASON. Runs before Ray, in dry runs too.
cluster_settings() {
  [[ "${REUSE_RAY}" == 0 || "${REUSE_RAY}" == 1 ]] || die "REUSE_RAY must be 0 or 1, got '${REUSE_RAY}'"
  if [[ -n "${NCCL_NVLS_ENABLE:-}" ]]; then
    [[ "${NCCL_NVLS_ENABLE}" == 0 || "${NCCL_NVLS_ENABLE}" == 1 ]] \
      || die "NCCL_NVLS_ENABLE must be 0 or 1, got '${NCCL_NVLS_ENABLE}'"
    JOB_NVLS="${NCCL_NVLS_ENABLE}"; NVLS_REASON="set by the caller"
  else
    # As slime's own launch scripts decide: NVLS on exactly when `nvidia-smi topo -m` lists NVLink
    # connections (NV<n>; the legend's "NV#" does not count). No nvidia-smi or no driver: off.
    local count
    count=$( { timeout 60 nvidia-smi topo -m 2>/dev/null || true; } | grep -oE 'NV[0-9]+' | wc -l ) || true
    count=$(( ${count:-0} + 0 ))
    if [[ "${count}" -gt 0 ]]; then JOB_NVLS=1; else JOB_NVLS=0; fi
    NVLS_REASON="${count} NVLink entries in \`nvidia-smi topo -m\` on this node"
  fi
  local var
  for var in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME; do
    # the value goes into the runtime-env YAML: only what an interface list can hold (^ excludes, = exact)
    if [[ -n "${!var:-}" && ! "${!var}" =~ ^[A-Za-z0-9_.:,=^-]+$ ]]; then
      die "${var}=$(printf '%q' "${!var}") is not an interface list (letters, digits and _ . : , = ^ - only)"
    fi
  done
}

# 0 when a cluster runs here and REUSE_RAY=1, 1 when none runs; refuses (exit 2) otherwise, since a
# running cluster may be another run's, with other nodes, GPUs or environment.
reuse_running_ray() {
  ray status >/dev/null 2>&1 || return 1
  [[ "${REUSE_RAY}" == 1 ]] || die "a Ray cluster is already running on this node (\`ray status\` succeeded) and may be \
another run's; pass --reuse-ray (REUSE_RAY=1) to submit to it as it is, or stop it first with \`ray stop\`"
  echo "reusing the Ray cluster already running on this node (REUSE_RAY=1)" >&2
}

# Run identity for the evaluation hook, as top-level keys of slime's --custom-config-path (every
# Ray actor sees them on args). Written next to the checkpoints, which every node must mount.
run_config_yaml() {
  echo "epic_run_name: \"${RUN_NAME}\""
  echo "epic_method: \"${METHOD}\""
  echo "epic_eval_records_path: \"${EVAL_RECORDS}\""
}

# The launcher's own checks run in PYTHON (the YAML configs, the driver's flags): without the project's
# environment they would end in an import traceback, so say in one line what is missing and what to do.
check_python() {
  command -v "${PYTHON}" >/dev/null 2>&1 \
    || die "PYTHON=${PYTHON} is not a command: activate the project's virtual environment or set PYTHON"
  local missing
  missing=$(cd "${REPO_DIR}" && "${PYTHON}" -c 'import importlib.util as u
print(" ".join(m for m in ("torch", "yaml", "epic_slime") if u.find_spec(m) is None))' 2>/dev/null) \
    || die "PYTHON=${PYTHON} does not run: activate the project's virtual environment or set PYTHON"
  [[ -z "${missing}" ]] || die "PYTHON=${PYTHON} cannot import ${missing// /, } (needed to check the flags): \
activate the project's virtual environment (. .venv/bin/activate) or install it (README), or set PYTHON=<its python>"
}

# read_config_args FILE...: the driver flags the YAML configs set (later files win) into CONFIG_ARGS.
read_config_args() {
  check_python
  CONFIG_ARGS=()
  local arg
  while IFS= read -r -d '' arg; do CONFIG_ARGS+=("${arg}"); done < <(
    cd "${REPO_DIR}" && "${PYTHON}" -m epic_slime.slime.cli.config_flags -0 "$@"
  )
  [[ ${#CONFIG_ARGS[@]} -gt 0 ]] || die "reading the YAML configs failed"
}

# The shared driver flags: the four benchmarks of `epic-slime prepare-data`, and W&B when
# WANDB_API_KEY is set (the key itself only travels in the job's private runtime env).
shared_driver_args() {
  EVAL_DATA_ARGS=(--eval-prompt-data aime_2024 "${DATA_DIR}/eval/aime_2024.jsonl" aime_2025 "${DATA_DIR}/eval/aime_2025.jsonl"
                  amc_2023 "${DATA_DIR}/eval/amc_2023.jsonl" hmmt_feb_2025 "${DATA_DIR}/eval/hmmt_feb_2025.jsonl")
  WANDB_ARGS=()
  if [[ -n "${WANDB_API_KEY:-}" ]]; then
    WANDB_ARGS=(--use-wandb --wandb-project "${WANDB_PROJECT}" --wandb-group "${RUN_NAME}")
  fi
}

runtime_env_yaml() {  # $1 = "redact" to print, anything else to submit
  echo "env_vars:"
  echo "  PYTHONPATH: \"${MEGATRON_PATH}:${REPO_DIR}\""
  echo "  CUDA_DEVICE_MAX_CONNECTIONS: \"1\""
  echo "  PYTHONUNBUFFERED: \"1\""
  echo "  NCCL_NVLS_ENABLE: \"${JOB_NVLS}\""
  local var
  for var in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME; do  # only when the caller set them
    if [[ -n "${!var:-}" ]]; then echo "  ${var}: \"${!var}\""; fi
  done
  if [[ -n "${WANDB_API_KEY:-}" ]]; then
    if [[ "$1" == "redact" ]]; then echo "  WANDB_API_KEY: <redacted>"; else echo "  WANDB_API_KEY: \"${WANDB_API_KEY}\""; fi
  fi
}

submit_command() {  # into SUBMIT; RUNTIME_ENV_YAML is replaced by the runtime-env file at submission
  SUBMIT=(ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" --runtime-env RUNTIME_ENV_YAML
          -- python3 -m epic_slime.slime.train "${DRIVER_ARGS[@]}")
}

# Before Ray starts: validate the cluster settings and the driver's flags (a typo fails in seconds,
# not after the nodes joined). DRY_RUN=1: print the runtime env (W&B key redacted), the run config
# and the command, let the flag checker validate, say that nothing was submitted, and exit with the
# checker's status.
dry_run_or_check_flags() {
  cluster_settings
  submit_command
  if [[ "${DRY_RUN}" != "1" ]]; then
    "${PYTHON}" -m epic_slime.slime.cli.dry_run "${DRIVER_ARGS[@]}" >/dev/null
    return
  fi
  echo "# runtime env (RUNTIME_ENV_YAML):"
  runtime_env_yaml redact | sed 's/^/#   /'
  echo "# NCCL_NVLS_ENABLE=${JOB_NVLS}: ${NVLS_REASON}"
  if declare -F dry_run_price >/dev/null; then dry_run_price; fi   # the launcher's simulated price, if it has one
  echo "# ${RUN_CONFIG} (written at submission):"
  run_config_yaml | sed 's/^/#   /'
  printf '%q ' "${SUBMIT[@]}"; echo
  cd "${REPO_DIR}"
  local status=0
  "${PYTHON}" -m epic_slime.slime.cli.dry_run "${DRIVER_ARGS[@]}" || status=$?
  if [[ "${status}" -eq 0 ]]; then
    # say how to submit the way the dry run was asked for: the flag (DRY_RUN_ASKED, set by the launcher) or the variable
    echo "# dry run (DRY_RUN=1): nothing was submitted and no Ray cluster started; to submit, run again without" \
         "${DRY_RUN_ASKED:-DRY_RUN=1 (DRY_RUN=0 or unset)}"
  else
    echo "# dry run (DRY_RUN=1): nothing was submitted and no Ray cluster started; the flag check failed" \
         "(exit ${status}): fix the error above, then dry-run again"
  fi
  exit "${status}"
}

# Write the run config, hand the runtime env over in a private file, submit.
submit_job() {
  submit_command
  mkdir -p "${SAVE_DIR}"
  run_config_yaml > "${RUN_CONFIG}"
  umask 077
  RUNTIME_ENV_FILE="$(mktemp --suffix=.yaml)"
  trap 'rm -f "${RUNTIME_ENV_FILE}"' EXIT
  runtime_env_yaml submit > "${RUNTIME_ENV_FILE}"
  SUBMIT[6]="${RUNTIME_ENV_FILE}"  # the placeholder after --runtime-env
  cd "${REPO_DIR}"
  "${SUBMIT[@]}"
}
