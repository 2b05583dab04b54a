"""Evaluate a Hugging Face checkpoint (transformers generate, mean@8 protocol) into eval records.

    python eval/evaluate.py --model PATH --data DATA_DIR --out records.jsonl --run R --method M --seed 1 --step 0
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.evaluation.generate_hf import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
