# Sourced by the launchers (launch/qwen3_30b_epic.sh, launch/smoke_1gpu.sh): the Ray job submission
# they share. Needs DRIVER_ARGS, REPO_DIR, MEGATRON_PATH, RAY_DASHBOARD_PORT, RUN_CONFIG, SAVE_DIR,
# PYTHON, DRY_RUN and a run_config_yaml function. The job API is addressed on 127.0.0.1 only.

runtime_env_yaml() {  # $1 = "redact" to print, anything else to submit
  echo "env_vars:"
  echo "  PYTHONPATH: \"${MEGATRON_PATH}:${REPO_DIR}\""
  echo "  CUDA_DEVICE_MAX_CONNECTIONS: \"1\""
  echo "  PYTHONUNBUFFERED: \"1\""
  if [[ -n "${WANDB_API_KEY:-}" ]]; then
    if [[ "$1" == "redact" ]]; then echo "  WANDB_API_KEY: <redacted>"; else echo "  WANDB_API_KEY: \"${WANDB_API_KEY}\""; fi
  fi
}

SUBMIT=(ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" --runtime-env RUNTIME_ENV_YAML
        -- python3 -m epic_slime.slime.train "${DRIVER_ARGS[@]}")

# Before Ray starts: validate the driver's flags (a typo fails in seconds, not after the nodes
# joined). DRY_RUN=1: print the runtime env (W&B key redacted), the run config and the command, then
# let the flag checker validate and exit with its status.
dry_run_or_check_flags() {
  if [[ "${DRY_RUN}" != "1" ]]; then
    "${PYTHON}" -m epic_slime.slime.flags "${DRIVER_ARGS[@]}" >/dev/null
    return
  fi
  echo "# runtime env (RUNTIME_ENV_YAML):"
  runtime_env_yaml redact | sed 's/^/#   /'
  echo "# ${RUN_CONFIG} (written at submission):"
  run_config_yaml | sed 's/^/#   /'
  printf '%q ' "${SUBMIT[@]}"; echo
  cd "${REPO_DIR}"
  exec "${PYTHON}" -m epic_slime.slime.flags "${DRIVER_ARGS[@]}"
}

# Write the run config, hand the runtime env over in a private file, submit.
submit_job() {
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
