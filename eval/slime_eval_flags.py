"""Print slime's eval flags for the paper's protocol on prepared data (paste into a launch script).

    python eval/slime_eval_flags.py DATA_DIR
"""

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.evaluation.config import slime_eval_arguments  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    print(shlex.join(slime_eval_arguments(sys.argv[1])))
