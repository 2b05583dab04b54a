# epic-slime on slime's published image: slime, SGLang v0.5.15.post1, Megatron-LM, CUDA 12.9.
#   docker build -t epic-slime:latest .
# The base tag is pinned: slime's docker/version.txt at slime commit 624b824a is
# nightly-dev-20260810a, and its primary (CUDA 12) build is published as <version>-cu129.
ARG SLIME_IMAGE=slimerl/slime:nightly-dev-20260810a-cu129
FROM ${SLIME_IMAGE}

# slime's source inside the image (/root/slime) is checked out at the commit this project was
# written against, when the image's copy is a git checkout; SLIME_COMMIT="" keeps the image's.
ARG SLIME_COMMIT=624b824a898ab0ec1fcb4d373004c7f3852bf515
RUN if [ -n "${SLIME_COMMIT}" ] && [ -d /root/slime/.git ]; then \
        cd /root/slime && (git cat-file -e "${SLIME_COMMIT}^{commit}" 2>/dev/null || git fetch --quiet origin) \
        && git checkout --quiet "${SLIME_COMMIT}" && pip install --no-cache-dir --no-deps -e . ; \
    fi

WORKDIR /root/epic-slime
COPY pyproject.toml README.md ./
COPY epic_slime ./epic_slime
COPY launch ./launch
COPY configs ./configs
COPY eval ./eval
# --no-deps for torch / ray / transformers: the image's CUDA builds must stay; the project's
# light dependencies are installed explicitly. The build check imports the loss hook and slime
# itself (its full argument parser, i.e. SGLang and Megatron-LM too), then validates the paper's
# command line (dry run: every flag against the stored option strings).
RUN pip install --no-cache-dir --no-deps -e . \
    && pip install --no-cache-dir "pyyaml>=6" "tqdm>=4.60" "math-verify[antlr4-13-2]>=0.7" "matplotlib>=3.7" "scipy>=1.15" "pyarrow>=14" \
    && python -c "import epic_slime.slime.cli.flags, epic_slime.slime.cli.command_line, epic_slime.slime.cli.dry_run, epic_slime.slime.loss, epic_slime.slime.train, slime, slime.utils.arguments, slime.backends.megatron_utils.loss" \
    && DRY_RUN=1 bash launch/qwen3_30b_epic.sh > /dev/null

ENV PYTHONUNBUFFERED=1
CMD ["bash", "launch/qwen3_30b_epic.sh", "--help"]
