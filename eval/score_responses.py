"""Score generated responses (JSONL) into eval records; see epic_slime/evaluation/score.py.

    python eval/score_responses.py --responses gen.jsonl --out records.jsonl --run R --method M --seed 1 --step 0
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.evaluation.score import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
