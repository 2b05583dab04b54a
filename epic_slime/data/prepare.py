"""``epic-slime prepare-data``: DAPO-Math-17k and the four eval sets as slime-ready JSON Lines.

Output layout (``--out DIR``)::

    DIR/train/dapo_math_17k.jsonl      training prompts (de-duplicated by prompt)
    DIR/eval/aime_2024.jsonl           30 prompts
    DIR/eval/aime_2025.jsonl           30
    DIR/eval/amc_2023.jsonl            40 (identical prompt texts removed)
    DIR/eval/hmmt_feb_2025.jsonl       30
    DIR/manifest.json                  sources, counts, duplicates removed, warnings
    DIR/raw/                           downloaded source files (download mode only)

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
from epic_slime.data.download import DataUnavailableError, download_dataset
from epic_slime.data.files import DataFormatError, iter_rows, write_jsonl
from epic_slime.data.sources import ALL, BY_NAME, EVAL_SETS, TRAIN, DatasetSpec


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


def prepare_one(spec: DatasetSpec, out_dir: str, from_local: str | None, timeout: float) -> dict:
    if from_local:
        paths = [find_local_file(spec, from_local)]
        source = f"local:{os.path.basename(paths[0])}"
    else:
        paths = download_dataset(spec, os.path.join(out_dir, "raw"), timeout=timeout)
        source = f"hf:{spec.hf_id}"
    records, report = convert_rows(_chain_rows(paths), spec.name, source)
    if not records:
        raise DataUnavailableError(f"dataset '{spec.name}': no rows in {', '.join(paths)}")
    out_path = os.path.join(out_dir, spec.split, f"{spec.name}.jsonl")
    write_jsonl(out_path, records)
    entry = {"path": os.path.relpath(out_path, out_dir), "source": source, "hf_id": spec.hf_id,
             "inputs": paths, **report.as_dict(), "warnings": []}
    if spec.expected_prompts is not None and len(records) != spec.expected_prompts:
        entry["warnings"].append(f"expected {spec.expected_prompts} prompts, got {len(records)}")
    if report.conflicting_duplicates:
        entry["warnings"].append(
            f"{len(report.conflicting_duplicates)} repeated prompts had a different answer (first kept)")
    return entry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epic-slime prepare-data", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output folder (keep it outside the repository)")
    parser.add_argument("--from-local", metavar="FOLDER", default=None,
                        help="convert local files instead of downloading; file names: "
                        + "; ".join(f"{s.name}: {' | '.join(s.local_files)}" for s in ALL))
    parser.add_argument("--only", choices=("all", "train", "eval"), default="all")
    parser.add_argument("--datasets", nargs="+", choices=sorted(BY_NAME), default=None,
                        help="a subset of the datasets (default: all of --only)")
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
    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path) as handle:
            manifest = json.load(handle)
    datasets = manifest.setdefault("datasets", {})
    for spec in selected_specs(args):
        try:
            entry = prepare_one(spec, args.out, args.from_local, args.timeout)
        except (DataUnavailableError, DataFormatError, RowError) as error:
            print(f"prepare-data: {error}", file=sys.stderr)
            return 1
        datasets[spec.name] = entry
        note = f" (warning: {'; '.join(entry['warnings'])})" if entry["warnings"] else ""
        print(f"{spec.name:<15} {entry['records_out']:>6} prompts  ({entry['rows_in']} rows, "
              f"{entry['duplicates_removed']} duplicates removed) -> {entry['path']}{note}")
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle, indent=2)
    print(f"manifest: {manifest_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
