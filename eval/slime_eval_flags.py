"""Print slime's eval flags for the paper's protocol on prepared data (paste into a launch script).

    python eval/slime_eval_flags.py DATA_DIR

Imports the installed package (`pip install -e .`).
"""

import shlex
import sys

from epic_slime.evaluation.config import slime_eval_arguments

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    print(shlex.join(slime_eval_arguments(sys.argv[1])))
