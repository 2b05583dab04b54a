"""Table 1 and curves from eval records (same as `epic-slime report`).

    python eval/report.py --records RECORDS.jsonl [more files or folders] --out REPORT_DIR

Imports the installed package (`pip install -e .`).
"""

import sys

from epic_slime.evaluation.report import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
