"""Fetch a dataset repository's data files from the Hugging Face Hub over plain HTTPS.

Two requests kinds only: the repository listing (``/api/datasets/<id>``) and each data file
(``/datasets/<id>/resolve/main/<path>``). ``HF_ENDPOINT`` and ``HF_TOKEN`` are honoured (the
token is sent, never printed). Network failures become ``DataUnavailableError`` quickly
(short timeout) with a message that says how to supply the files locally.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request

from epic_slime.data.sources import DatasetSpec

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


class DataUnavailableError(RuntimeError):
    """A dataset could not be obtained (offline, missing file, unknown repository)."""


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _urlopen(url: str, timeout: float):
    """Single network entry point (tests replace it)."""
    request = urllib.request.Request(url, headers={"User-Agent": "epic-slime-prepare-data"})
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(request, timeout=timeout)


def offline_message(spec: DatasetSpec, reason: str) -> str:
    return (
        f"could not download dataset '{spec.name}' (Hugging Face: {spec.hf_id}) from {_endpoint()}: {reason}.\n"
        f"If this machine is offline, put the files in a folder and run "
        f"`epic-slime prepare-data --out DIR --from-local FOLDER`; accepted file names for "
        f"'{spec.name}': {', '.join(spec.local_files)}."
    )


def list_data_files(spec: DatasetSpec, timeout: float) -> list[str]:
    url = f"{_endpoint()}/api/datasets/{spec.hf_id}"
    try:
        with _urlopen(url, timeout) as response:
            info = json.loads(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise DataUnavailableError(offline_message(spec, f"{type(error).__name__}: {error}")) from None
    names = [s.get("rfilename", "") for s in info.get("siblings", []) if isinstance(s, dict)]
    files = sorted(n for n in names if n.endswith(DATA_SUFFIXES) and not os.path.basename(n).startswith("."))
    if not files:
        raise DataUnavailableError(offline_message(spec, f"the repository lists no data files ({DATA_SUFFIXES})"))
    return files


def download_dataset(spec: DatasetSpec, cache_dir: str, timeout: float = 15.0) -> list[str]:
    """Download every data file of ``spec.hf_id`` into ``cache_dir``; returns local paths (cached files reused)."""
    paths = []
    for name in list_data_files(spec, timeout):
        target = os.path.join(cache_dir, spec.hf_id.replace("/", "__"), name)
        if not os.path.isfile(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            url = f"{_endpoint()}/datasets/{spec.hf_id}/resolve/main/{urllib.parse.quote(name)}"
            tmp = target + ".part"
            try:
                with _urlopen(url, timeout) as response, open(tmp, "wb") as handle:
                    shutil.copyfileobj(response, handle, length=1 << 20)
            except (urllib.error.URLError, OSError) as error:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise DataUnavailableError(offline_message(spec, f"{type(error).__name__} on {name}: {error}")) from None
            os.replace(tmp, target)
        paths.append(target)
    return paths
