"""Checkpoints through slime's real Megatron actor (issue 45 item 6): a run SIGKILLed at each boundary of
a checkpoint's two saves resumes from what is on disk and trains every prompt exactly once.

One run of 5 rollouts (2 prompts x 2 samples each, the next rollout's prompts taken before a rollout
trains, as in the overlap schedule) lives four times in processes of its own
(tests/support/megatron_resume.py): slime's MegatronTrainRayActor on CPU, the project's
StreamingDataSource, the driver's `save_checkpoint` (data state, then the model through slime's
checkpoint.py and megatron.training's `save_checkpoint`) and its `ModelSaves` marks. Each life is
killed (SIGKILL of its own process) at one boundary of one rollout's save:

1. `first` at rollout 1: the data state of 1 written, its model save not begun;
2. `model_write` at rollout 2: inside Megatron's save, every shard written, its tracker not;
3. `after` at rollout 3: both saves and their marks done;
4. no kill: the run ends.

Each life starts as slime's driver does (the actor's `init` loads Megatron's tracker, the data source
the state saved with the rollout before). Between lives the test asks the project's resume rule about
the newest data state on disk (`StreamingDataSource.load`, what `--ckpt-step` of it would do).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from support.megatron_run import REPO, skip_reason, wait_or_kill, worker_env

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)

LIFE = REPO / "tests" / "support" / "megatron_resume.py"
KILLS = [("first", 1), ("model_write", 2), ("after", 3), None]
NUM_ROLLOUT, PROMPTS_PER_ROLLOUT = 5, 2


def _newest_data_state_resume(ckpt) -> str:
    """What the project's resume rule says of the newest data state on disk (a resume with --ckpt-step
    of it): "accepted", or its refusal."""
    import re

    from epic_slime.slime.data_source import StreamingDataSource

    newest = max(int(m.group(1)) for p in (ckpt / "rollout").iterdir() if (m := re.search(r"dict_(\d+)\.pt$", p.name)))
    args = argparse.Namespace(
        rollout_global_dataset=True, prompt_data=None, n_samples_per_prompt=2, buffer_filter_path=None,
        rollout_shuffle=False, save=str(ckpt), load=str(ckpt),
    )  # fmt: skip
    try:
        StreamingDataSource(args).load(newest)
    except RuntimeError as exc:
        return f"{newest}: {exc}"
    return f"{newest}: accepted"


@pytest.fixture(scope="module")
def lives(tmp_path_factory):
    """The four lives in turn; after each: its exit code, Megatron's tracker, the driver's marks and what
    the resume rule says of the newest data state. Returns (per life, the journal's events)."""
    from epic_slime.slime.stream.checkpoint_marks import megatron_tracker_iteration
    from support.real_sglang import free_port

    work = tmp_path_factory.mktemp("megatron_kill")
    journal, ckpt, after = work / "journal.jsonl", work / "ckpt", []
    for n, kill in enumerate(KILLS, 1):
        env = {"EPIC_ACTOR_PORT": str(free_port())}
        if kill:
            env["EPIC_KILL"] = f"{kill[0]}:{kill[1]}"
        with open(work / f"life{n}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(LIFE), str(work), str(journal)],
                env=worker_env(**env),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: see below
            )
            try:
                wait_or_kill(proc, 900)
            finally:
                # a SIGKILLed life leaves its multiprocessing children (a spawn child, a resource tracker)
                # orphaned in its group: none outlives its life
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        after.append(
            {
                "returncode": proc.returncode,
                "log": (work / f"life{n}.log").read_text()[-3000:],
                "tracker": megatron_tracker_iteration(str(ckpt)),
                "marks": sorted(p.name for p in (ckpt / "rollout").glob("epic_model_complete_*")),
                "iters": sorted(p.name for p in ckpt.glob("iter_*")),
                "newest_data_state": _newest_data_state_resume(ckpt),
            }
        )
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    return after, events


def _by_life(events) -> list[list[dict]]:
    out: list[list[dict]] = []
    for e in events:
        if e["event"] == "start":
            out.append([])
        out[-1].append(e)
    return out


def test_each_life_is_killed_where_asked_and_resumes_after_its_last_whole_checkpoint(lives):
    after, events = lives
    assert [a["returncode"] for a in after] == [-9, -9, -9, 0], [a["log"] for a in after]
    killed = [(e["point"], e["rollout"]) for e in events if e["event"] == "killed"]
    assert killed == [k for k in KILLS if k]
    # Megatron's tracker after each kill: the data state of 1 alone leaves 0; a model write of 2 cut
    # before its tracker leaves 1 (its shards on disk); a kill after both saves of 3 leaves 3
    assert [a["tracker"] for a in after] == [0, 1, 3, 4]
    assert "iter_0000002" in after[1]["iters"] and "epic_model_complete_2" not in after[1]["marks"]
    assert after[0]["iters"] == ["iter_0000000"]  # the kill came before the model save of 1 began
    starts = [e["start"] for e in events if e["event"] == "start"]
    assert starts == [0, 1, 2, 4]  # each life resumes after the newest model checkpoint that is whole


def test_every_prompt_is_trained_exactly_once_across_three_kills(lives):
    """The lineage of the final weights: each life's rollouts below the next life's start (the ones its
    saved weights carry), then the last life's. Each rollout once, each prompt once, none skipped."""
    _, events = lives
    per_life = _by_life(events)
    starts = [life[0]["start"] for life in per_life] + [NUM_ROLLOUT]
    lineage = []
    for life, next_start in zip(per_life, starts[1:], strict=True):
        lineage += [(e["rollout"], e["prompts"]) for e in life if e["event"] == "trained" and e["rollout"] < next_start]
    assert [r for r, _ in lineage] == list(range(NUM_ROLLOUT))
    prompts = [p for _, ps in lineage for p in ps]
    assert sorted(prompts) == list(range(NUM_ROLLOUT * PROMPTS_PER_ROLLOUT)), "a prompt lost or trained twice"
    # the killed lives trained rollouts their weights never saved (1 in life 1, 2 in life 2): a resume
    # trains exactly those prompts again, handed out first from the pending groups saved with the data state
    lost = [(e["rollout"], e["prompts"]) for life, s in zip(per_life, starts[1:]) for e in life
            if e["event"] == "trained" and e["rollout"] >= s]  # fmt: skip
    assert lost == [(1, [2, 3]), (2, [4, 5])]
    for life, previous in zip(per_life[1:], per_life, strict=False):
        first_take = next(e for e in life if e["event"] == "take")
        taken_before = next(e for e in previous if e["event"] == "take" and e["rollout"] == first_take["rollout"])
        assert first_take["prompts"] == taken_before["prompts"]
        assert life[0]["restored"] == PROMPTS_PER_ROLLOUT  # the next rollout's groups, saved as pending
    # the data source's own accounting at the end: nothing in flight, no prompt numbered past the run's
    end = next(e for e in events if e["event"] == "end")
    assert end["in_flight"] == 0 and end["dropped"] == 0 and end["consumed"] == end["trained"] == PROMPTS_PER_ROLLOUT
    assert end["next_prompt"] == NUM_ROLLOUT * PROMPTS_PER_ROLLOUT


def test_a_resumed_actor_holds_exactly_the_weights_saved_at_its_checkpoint(lives):
    _, events = lives
    per_life = _by_life(events)
    for n, life in enumerate(per_life[1:], 2):
        start = life[0]["start"]
        saved = [e["weights"] for e in events[: events.index(life[0])] if e.get("rollout") == start - 1
                 and e["event"] == "saved_model"]  # fmt: skip
        assert saved, f"life {n}: no model save of rollout {start - 1} before it"
        assert life[0]["weights"] == saved[-1], f"life {n} did not load the weights saved at rollout {start - 1}"
        other = [e["weights"] for e in events if e["event"] == "saved_model" and e["rollout"] != start - 1]
        assert all(w != life[0]["weights"] for w in other)  # training moved them: the equality says something


def test_the_resume_rule_refuses_a_data_state_whose_model_is_not_whole(lives):
    """--ckpt-step of the newest data state: refused after the kill before the model save and after the
    cut model write (naming the last consistent save), accepted after the kill past both saves."""
    after, _ = lives
    verdicts = [a["newest_data_state"] for a in after]
    assert verdicts[0].startswith("1: ") and "not marked complete" in verdicts[0], verdicts[0]
    assert "resume from it with --ckpt-step 0" in verdicts[0]
    assert verdicts[1].startswith("2: ") and "not marked complete" in verdicts[1], verdicts[1]
    assert "resume from it with --ckpt-step 1" in verdicts[1]
    assert verdicts[2] == "3: accepted" and verdicts[3] == "4: accepted"
    assert after[2]["marks"][-1] == "epic_model_complete_3"
