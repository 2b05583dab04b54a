#!/usr/bin/env bash
# verl as its users install it (docs/integrations.md, "verl"), in a venv of its own: verl 0.9.1 with the
# dependency set verl declares, then this checkout as a plug-in with --no-deps, so that verl's pins
# (transformers <5.11, hydra-core 1.3 and its antlr4 4.9 runtime) stay as verl set them. The verl part is
# cached on this machine by the hash of this script (a warm run reuses it); the plug-in is installed on
# every run, from the checkout being tested. Prints the venv's python on its last line.
# tests/integrations/test_verl_user_path.py checks that the two `pip install` lines below are the page's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
key=$(sha256sum "$here/verl_venv.sh" | cut -c1-16)
cache="${EPIC_SLIME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epic-slime}"
venv="$cache/verl-venv-$key"
py="$venv/bin/python"
if [ -f "$venv/.complete" ]; then
  echo "verl venv: cached ($venv)" >&2
else
  rm -rf "$venv"
  mkdir -p "$cache"
  echo "verl venv: installing into $venv (not cached for this script's hash)" >&2
  start=$(date +%s)
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip >&2
  # CI only: the CPU torch first (the line of the README's command 1), so that verl's stack does not pull
  # a multi-GB CUDA torch. On a GPU machine verl's environment already holds its CUDA torch.
  PIP_RETRIES=0 "$py" -m pip install -q "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu >&2
  "$py" -m pip install "verl==0.9.1" >&2
  date -u +%FT%TZ > "$venv/.complete"   # written last: a cut-short install is redone
  echo "verl venv: installed in $(( $(date +%s) - start )) s" >&2
  # older venvs (other hashes) are several GB each: keep only this one
  find "$cache" -maxdepth 1 -name 'verl-venv-*' ! -name "verl-venv-$key" -exec rm -rf {} + 2>/dev/null || true
fi
# the plug-in, from this checkout (a few seconds; its verl.plugins entry point is what `import verl` loads)
(cd "$repo" && "$py" -m pip install --no-deps -e . >&2)
echo "$py"
