"""Evaluate a Hugging Face checkpoint (--engine sglang | transformers, paper sampling by default) into eval records.

    python eval/evaluate.py --model PATH --data DATA_DIR --out records.jsonl --run R --method M --seed 1 --step 0

Same as `epic-slime evaluate`; imports the installed package (`pip install -e .`).
"""

import sys

from epic_slime.evaluation.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
