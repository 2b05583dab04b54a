#!/usr/bin/env bash
# Paper Table 1 row "epic" (configs/methods/epic.yaml) on the default 4 x 8 GPU cluster, with the
# paper's protocol by default: synchronous (MAX_STALENESS=0), update depth 8, configs/paper/table2.yaml.
# ASYNC=1 (or --max-staleness K) runs the asynchronous variant; every setting of
# launch/qwen3_30b_epic.sh can still be overridden (environment or flags). See _paper_protocol.sh.
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/_paper_protocol.sh" epic "$@"
