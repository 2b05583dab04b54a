#!/usr/bin/env bash
# Provision the real SGLang 0.5.15.post1 (CPU) and sglang-router 0.3.2 in a venv of their own, cached on
# this machine by the hash of .ci/sglang-cpu.txt and this script: a warm machine reuses it, a fresh one
# installs it (about 4-7 min, nothing compiled). Prints the venv's python on its last line.
# The project's own venv keeps torch 2.13 CPU: the tests talk to the server over HTTP only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
SGLANG_VERSION="0.5.15.post1"
key=$(cat "$here/sglang-cpu.txt" "$here/sglang_venv.sh" | sha256sum | cut -c1-16)
cache="${EPIC_SLIME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epic-slime}"
venv="$cache/sglang-venv-$key"
if [ -f "$venv/.complete" ]; then
  echo "sglang venv: cached ($venv)" >&2
else
  rm -rf "$venv"
  mkdir -p "$cache"
  echo "sglang venv: installing into $venv (not cached for this requirements hash)" >&2
  start=$(date +%s)
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  PIP_RETRIES=0 "$venv/bin/python" -m pip install -q -r "$here/sglang-cpu.txt"
  "$venv/bin/python" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
  "$venv/bin/python" -c "import sglang, sglang_router, torchvision.io" >/dev/null
  date -u +%FT%TZ > "$venv/.complete"   # written last: a cut-short install is redone
  echo "sglang venv: installed in $(( $(date +%s) - start )) s" >&2
  # older venvs of this project (other hashes) are 7 GB each: keep only this one
  find "$cache" -maxdepth 1 -name 'sglang-venv-*' ! -name "sglang-venv-$key" -exec rm -rf {} + 2>/dev/null || true
fi
echo "$venv/bin/python"
