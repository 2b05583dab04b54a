"""Evaluate a Hugging Face checkpoint (--engine sglang | transformers, paper sampling by default) into eval records.

    python eval/evaluate.py --model PATH --data DATA_DIR --out records.jsonl --run R --method M --seed 1 --step 0
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.evaluation.evaluate import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
