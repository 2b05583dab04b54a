"""Table 1 and curves from eval records (same as `epic-slime report`).

    python eval/report.py --records RECORDS.jsonl [more files or folders] --out REPORT_DIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.evaluation.report import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
