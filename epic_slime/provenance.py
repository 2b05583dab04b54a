"""Provenance: which code, which versions and how much memory produced a result.

One module for the embedded runtime (run summary, `epic-slime --version`), the slime driver
(`perf/driver_rss_mb`) and the study (its `provenance.jsonl`), so that they record the same facts
the same way. Nothing here imports torch at module level or needs slime.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def git_commit(repo: Path | str = REPO_ROOT, short: bool = False) -> str | None:
    """HEAD of `repo`, with '-dirty' when tracked files changed; None outside git (or without git)."""
    try:
        args = ["git", "-C", str(repo), "rev-parse"] + (["--short"] if short else []) + ["HEAD"]
        head = subprocess.run(args, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """The project's version, torch's and the git commit of the checkout (None outside git)."""
    import torch

    from epic_slime import __version__

    return {"epic_slime": __version__, "torch": torch.__version__, "git_commit": git_commit()}


# the packages whose numerics a CPU run depends on: one recipe, code and thread count train the same weights bit
# for bit, yet the stress ladder's 2,500-step warm start (trained 2026-12-03 in a venv whose versions were not
# recorded) and its rerun on 2026-12-06 (torch 2.13.0, transformers 5.25.0) ended at test mean@8 0.385 and 0.450
NUMERIC_STACK = ("torch", "transformers")


def stack_versions() -> dict:
    """Installed versions of NUMERIC_STACK (None where absent), read without importing them."""
    from importlib import metadata

    found = {}
    for name in NUMERIC_STACK:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def resident_memory_mib() -> float:
    """Resident memory of this process in MiB (Linux /proc; resource's peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
