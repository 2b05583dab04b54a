"""Score generated responses (JSONL) into eval records; see epic_slime/evaluation/score.py.

    python eval/score_responses.py --responses gen.jsonl --out records.jsonl --run R --method M --seed 1 --step 0

Imports the installed package (`pip install -e .`).
"""

import sys

from epic_slime.evaluation.score import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
