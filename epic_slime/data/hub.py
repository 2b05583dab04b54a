"""Dataset files from the Hugging Face Hub through ``huggingface_hub`` (``snapshot_download``,
``repo_type="dataset"``), so the user's Hub setup applies as is: cache (``HF_HOME`` /
``HF_HUB_CACHE``), token (``HF_TOKEN`` / ``hf auth login``), mirror (``HF_ENDPOINT``), offline mode
(``HF_HUB_OFFLINE=1``: the cached snapshot of the revision is used), retries, resume and progress bars.

What is returned is what the manifest records: the revision asked for, the commit it resolved to
and every data file with its sha256.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from epic_slime.data.sources import DatasetSpec

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_COMMIT = re.compile(r"[0-9a-f]{40}")


class DataUnavailableError(RuntimeError):
    """A dataset could not be obtained (offline, gated, missing file, unknown repository or revision)."""


@dataclass(frozen=True)
class HubFile:
    path: str  # path inside the repository ("data/train.parquet"), the manifest key
    local_path: str  # where huggingface_hub keeps it (the HF cache snapshot)
    sha256: str
    size: int


@dataclass(frozen=True)
class HubSnapshot:
    revision: str  # as asked ("main", a tag or a commit)
    commit: str  # the commit it resolved to
    files: tuple[HubFile, ...]


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def from_local_hint(spec: DatasetSpec) -> str:
    return (
        f"If this machine cannot reach the Hub, put the files in a folder and run "
        f"`epic-slime prepare-data --out DIR --from-local FOLDER`; accepted file names for "
        f"'{spec.name}': {', '.join(spec.local_files)}."
    )


def _library_reason(error: Exception) -> str:
    """The library's own message, plus what to do for the cases it leaves implicit."""
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled

    reason = f"{type(error).__name__}: {error}".strip()
    if isinstance(error, GatedRepoError):
        reason += (
            "\n(gated dataset: accept its conditions on the dataset page, then set HF_TOKEN or run `hf auth login`)"
        )
    cause = error.__cause__
    if isinstance(cause, OfflineModeIsEnabled):
        reason += "\n(HF_HUB_OFFLINE is set and this revision is not in the Hugging Face cache)"
    return reason


def _data_files(snapshot_dir: str) -> list[str]:
    """Data files of a snapshot, as sorted repository paths (hidden files and folders skipped)."""
    found = []
    for root, dirs, names in os.walk(snapshot_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.endswith(DATA_SUFFIXES) and not name.startswith("."):
                found.append(os.path.relpath(os.path.join(root, name), snapshot_dir).replace(os.sep, "/"))
    return sorted(found)


def download_snapshot(
    spec: DatasetSpec, revision: str, cache_dir: str | None = None, timeout: float = 15.0
) -> HubSnapshot:
    """Download (or reuse from the HF cache) the data files of ``spec.hf_id`` at ``revision``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        snapshot_dir = snapshot_download(
            spec.hf_id,
            repo_type="dataset",
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=[f"*{suffix}" for suffix in DATA_SUFFIXES],
            etag_timeout=timeout,
            # read at call time: the library reads HF_ENDPOINT once, at import
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, HFValidationError, OSError, ValueError) as error:
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        raise DataUnavailableError(
            f"could not download dataset '{spec.name}' (Hugging Face dataset {spec.hf_id}, revision "
            f"{revision}) from {endpoint}:\n{_library_reason(error)}\n{from_local_hint(spec)}"
        ) from None
    commit = os.path.basename(os.path.normpath(snapshot_dir))
    if not _COMMIT.fullmatch(commit):  # a snapshot folder is always named by its commit
        raise DataUnavailableError(f"dataset '{spec.name}': unexpected snapshot folder {snapshot_dir}")
    paths = _data_files(snapshot_dir)
    if not paths:
        raise DataUnavailableError(
            f"dataset '{spec.name}' ({spec.hf_id} at {commit}) has no data files ({', '.join(DATA_SUFFIXES)})\n"
            f"{from_local_hint(spec)}"
        )
    files = []
    for path in paths:
        local = os.path.join(snapshot_dir, path)
        files.append(HubFile(path, local, file_sha256(local), os.path.getsize(local)))
    return HubSnapshot(revision, commit, tuple(files))
