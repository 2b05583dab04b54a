"""``epic-slime prepare-data``: DAPO-Math-17k and the four eval sets as slime-ready JSON Lines.

Output layout (``--out DIR``)::

    DIR/train/dapo_math_17k.jsonl      training prompts (de-duplicated by prompt)
    DIR/eval/aime_2024.jsonl           30 prompts
    DIR/eval/aime_2025.jsonl           30
    DIR/eval/amc_2023.jsonl            40 (identical prompt texts removed)
    DIR/eval/hmmt_feb_2025.jsonl       30
    DIR/manifest.json                  per dataset: source, revision and resolved commit, sha256 of
                                       every file read, counts, duplicates removed, warnings

Downloads go through ``huggingface_hub`` (its cache, token, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``).
A later run into the same ``DIR`` checks every file it reads against the sha256 the manifest
recorded and refuses a changed file (``--accept-changed NAME`` records the new one instead).

Each line: ``{"prompt": [{"role": "user", "content": <DAPO template>}], "label": "<answer>",
"metadata": {"benchmark", "problem_id", "source"}}``. With slime: ``--input-key prompt
--label-key label --metadata-key metadata --apply-chat-template``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from epic_slime.data.convert import RowError, convert_rows
from epic_slime.data.files import DataFormatError, iter_rows, write_jsonl
from epic_slime.data.hub import DataUnavailableError, download_snapshot, file_sha256
from epic_slime.data.sources import ALL, BY_NAME, EVAL_SETS, TRAIN, DatasetSpec


class DataChangedError(DataUnavailableError):
    """A file's sha256 differs from the one the manifest recorded."""


def find_local_file(spec: DatasetSpec, folder: str) -> str:
    for name in spec.local_files:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise DataUnavailableError(
        f"dataset '{spec.name}' not found in {folder}: expected one of {', '.join(spec.local_files)} "
        f"(a copy of Hugging Face {spec.hf_id}, or drop --from-local to download it)"
    )


def _chain_rows(paths: list[str]):
    for path in paths:
        yield from iter_rows(path)


def check_recorded_hashes(
    spec: DatasetSpec, previous: dict | None, source: str, files: list[dict], commit: str | None
) -> None:
    """Refuse a file whose sha256 differs from the previous manifest entry of the same source."""
    if not previous or previous.get("source") != source:
        return
    recorded = {f["path"]: f["sha256"] for f in previous.get("files", [])}
    changed = [f for f in files if f["path"] in recorded and recorded[f["path"]] != f["sha256"]]
    if not changed:
        return
    lines = [f"  {f['path']}: recorded sha256 {recorded[f['path']]}, now {f['sha256']}" for f in changed]
    old_commit = previous.get("commit")
    pin = (
        f" To rebuild the recorded data, pass --revision {spec.name}={old_commit}."
        if old_commit and old_commit != commit
        else ""
    )
    raise DataChangedError(
        f"dataset '{spec.name}' ({source}{', commit ' + commit if commit else ''}) has files that differ from "
        f"the ones recorded in the manifest{' at commit ' + old_commit if old_commit else ''}:\n"
        + "\n".join(lines)
        + f"\nRefusing to overwrite the prepared data.{pin} To accept the new files, pass "
        f"--accept-changed {spec.name}."
    )


def prepare_one(
    spec: DatasetSpec,
    out_dir: str,
    from_local: str | None,
    timeout: float,
    revision: str | None = None,
    cache_dir: str | None = None,
    previous: dict | None = None,
    accept_changed: bool = False,
) -> dict:
    """One dataset: fetch (or find), hash, check against ``previous`` (its manifest entry), convert, write."""
    revision = revision or spec.revision
    if from_local:
        local = find_local_file(spec, from_local)
        paths = [local]
        source, commit = f"local:{os.path.basename(local)}", None
        files = [{"path": os.path.basename(local), "sha256": file_sha256(local), "bytes": os.path.getsize(local)}]
    else:
        snapshot = download_snapshot(spec, revision, cache_dir=cache_dir, timeout=timeout)
        paths = [f.local_path for f in snapshot.files]
        source, commit = f"hf:{spec.hf_id}", snapshot.commit
        files = [{"path": f.path, "sha256": f.sha256, "bytes": f.size} for f in snapshot.files]
    if not accept_changed:
        check_recorded_hashes(spec, previous, source, files, commit)
    records, report = convert_rows(_chain_rows(paths), spec.name, source)
    if not records:
        raise DataUnavailableError(f"dataset '{spec.name}': no rows in {', '.join(paths)}")
    out_path = os.path.join(out_dir, spec.split, f"{spec.name}.jsonl")
    write_jsonl(out_path, records)
    entry = {
        "path": os.path.relpath(out_path, out_dir),
        "source": source,
        "hf_id": spec.hf_id,
        "revision": None if from_local else revision,
        "commit": commit,
        "files": files,
        **report.as_dict(),
        "warnings": [],
    }
    if from_local and os.path.basename(paths[0]) in spec.sample_files:
        entry["warnings"].append(
            f"{os.path.basename(paths[0])} is a {report.rows_in}-row sample of {spec.display}, not the full set: "
            f"enough to check the pipeline, not to train on (drop --from-local to download {spec.hf_id})"
        )
    if spec.expected_prompts is not None and len(records) != spec.expected_prompts:
        entry["warnings"].append(f"expected {spec.expected_prompts} prompts, got {len(records)}")
    if report.conflicting_duplicates:
        entry["warnings"].append(
            f"{len(report.conflicting_duplicates)} repeated prompts had a different answer (first kept)"
        )
    return entry


def parse_revisions(values: list[str] | None) -> dict[str, str]:
    """``["hmmt_feb_2025=abc123", ...]`` -> {name: revision}; errors name the bad value."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, revision = value.partition("=")
        if not sep or not revision.strip():
            raise ValueError(f"--revision: expected NAME=REV, got {value!r}")
        if name not in BY_NAME:
            raise ValueError(f"--revision: unknown dataset {name!r} in {value!r}; known: {', '.join(sorted(BY_NAME))}")
        out[name] = revision.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epic-slime prepare-data", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output folder (keep it outside the repository)")
    parser.add_argument(
        "--from-local",
        metavar="FOLDER",
        default=None,
        help="convert local files instead of downloading; file names: "
        + "; ".join(f"{s.name}: {' | '.join(s.local_files)}" for s in ALL),
    )
    parser.add_argument("--only", choices=("all", "train", "eval"), default="all")
    parser.add_argument(
        "--datasets",
        nargs="+",
        choices=sorted(BY_NAME),
        default=None,
        help="a subset of the datasets (default: all of --only)",
    )
    parser.add_argument(
        "--revision",
        action="append",
        metavar="NAME=REV",
        default=None,
        help="Hub revision (branch, tag or commit) of one dataset; repeatable (default: main)",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="huggingface_hub cache folder (default: the library's, from HF_HOME / HF_HUB_CACHE)",
    )
    parser.add_argument(
        "--accept-changed",
        action="append",
        metavar="NAME",
        choices=sorted(BY_NAME),
        default=[],
        help="record this dataset's files even if their sha256 differs from the manifest's",
    )
    parser.add_argument("--timeout", type=float, default=15.0, help="network timeout per request, seconds")
    return parser


def selected_specs(args) -> list[DatasetSpec]:
    if args.datasets:
        return [BY_NAME[name] for name in args.datasets]
    return {"all": list(ALL), "train": [TRAIN], "eval": list(EVAL_SETS)}[args.only]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_local and not os.path.isdir(args.from_local):
        print(f"prepare-data: --from-local folder does not exist: {args.from_local}", file=sys.stderr)
        return 2
    try:
        revisions = parse_revisions(args.revision)
    except ValueError as error:
        print(f"prepare-data: {error}", file=sys.stderr)
        return 2
    if revisions and args.from_local:
        print("prepare-data: --revision applies to Hub downloads, not to --from-local", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path) as handle:
            manifest = json.load(handle)
    datasets = manifest.setdefault("datasets", {})
    status = 0
    for spec in selected_specs(args):
        try:
            entry = prepare_one(
                spec,
                args.out,
                args.from_local,
                args.timeout,
                revision=revisions.get(spec.name),
                cache_dir=args.cache_dir,
                previous=datasets.get(spec.name),
                accept_changed=spec.name in args.accept_changed,
            )
        except (DataUnavailableError, DataFormatError, RowError) as error:
            print(f"prepare-data: {error}", file=sys.stderr)
            status = 1
            break  # the datasets prepared so far stay recorded in the manifest
        datasets[spec.name] = entry
        note = f" (warning: {'; '.join(entry['warnings'])})" if entry["warnings"] else ""
        at = f" @ {entry['commit'][:12]}" if entry["commit"] else ""
        print(
            f"{spec.name:<15} {entry['records_out']:>6} prompts  ({entry['rows_in']} rows, "
            f"{entry['duplicates_removed']} duplicates removed{at}) -> {entry['path']}{note}"
        )
    tmp = manifest_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(manifest, handle, indent=2)
    os.replace(tmp, manifest_path)
    print(f"manifest: {manifest_path}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
