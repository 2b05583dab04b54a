"""The runtime's agent task (``--task-name calc``, issue 44 items 4 and 6) without Ray: the per-turn
rollout (``rollout_agent.generate_turn``) that lets a trajectory span weight versions, its staleness
version (the oldest model token's), the tool's counts as metrics (train and eval) with a scripted
policy whose counts are known, the summary line, the config rules, and the loss with tool spans
against the same trajectories with the spans cut out."""

from __future__ import annotations

import pytest
import torch
from support.calc_script import VersionedEngine, scripted_sample

from epic_slime.runtime import rollout_agent, task_calc
from epic_slime.runtime.config import parse_config
from epic_slime.runtime.config_rules import ConfigError
from epic_slime.runtime.task import Tokenizer
from epic_slime.runtime.train_step import agent_metrics, model_versions

TOK = Tokenizer()
SAMPLING = dict(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0, max_turns=3)


def test_a_trajectory_spans_the_versions_of_its_turns_and_its_group_is_as_old_as_its_oldest_token(monkeypatch):
    monkeypatch.setattr(task_calc, "sample", scripted_sample({"47*83": ["47*83=", "Answer:3901<eos>"]}))
    problem = task_calc._problem(47, 83)
    (g,) = rollout_agent.generate_turn(VersionedEngine(3), [(5, problem)], n_samples=2, **SAMPLING)
    assert g.unfinished and g.version == 3 and [s["turns"] for s in g.samples] == [1, 1]
    (g,) = rollout_agent.generate_turn(VersionedEngine(5), [g], n_samples=2, **SAMPLING)  # pushed in between
    assert not g.unfinished
    for s in g.samples:
        # model tokens carry the version of their turn, the tool's none
        assert s["token_versions"] == [3] * 6 + [None] * 5 + [5] * len(TOK.encode("Answer:3901")) + [5]
        assert s["reward"] == 1.0 and s["version"] == 3 and s["status"] == "completed"
        assert [s["group_id"] for s in g.samples] == [5, 5]
    assert g.version == 3  # the oldest model token, not the newest
    assert model_versions([g]) == [[3, 5]]
    assert agent_metrics(g.samples)["rollout/multi_version_frac"] == 1.0


def test_a_groups_version_is_its_oldest_model_token_across_samples():
    samples = [
        {"token_versions": [4, 4, None, 6], "loss_mask": [1, 1, 0, 1]},
        {"token_versions": [2, None, 9], "loss_mask": [1, 0, 1]},
    ]
    assert rollout_agent.oldest_model_version(samples) == 2
    assert rollout_agent.oldest_model_version([{"token_versions": [None], "loss_mask": [0]}]) is None


SCRIPT = {
    # right through the tool: 1 call, 0 errors, 2 turns, correct
    "47*83": ["47*83=", "Answer:3901<eos>"],
    # a refused call, then a right call, then the answer: 2 calls, 1 error, 3 turns, correct
    "12*34": ["12*=", "12*34=", "Answer:408<eos>"],
    # no call, a wrong guess: 0 calls, 1 turn, wrong
    "56*78": ["Answer:1<eos>"],
}


def _eval(monkeypatch, tool=True):
    monkeypatch.setattr(task_calc, "sample", scripted_sample(SCRIPT))
    problems = [task_calc._problem(47, 83), task_calc._problem(12, 34), task_calc._problem(56, 78)]
    return rollout_agent.evaluate(VersionedEngine(0), problems, k=2, tool=tool, **SAMPLING)


def test_eval_with_the_tool_scores_mean_at_k_and_counts_the_tools_use(monkeypatch):
    correct, stats, _ = _eval(monkeypatch)
    assert correct == [[True, True], [True, True], [False, False]]
    assert stats == pytest.approx(
        {"tool_calls_per_response": 3 / 3, "tool_errors_per_response": 1 / 3, "turns_per_response": 6 / 3}
    )


def test_train_metrics_count_the_tool_on_the_trained_samples(monkeypatch):
    monkeypatch.setattr(task_calc, "sample", scripted_sample(SCRIPT))
    reqs = [(0, task_calc._problem(47, 83)), (1, task_calc._problem(12, 34)), (2, task_calc._problem(56, 78))]
    groups = rollout_agent.generate_turn(VersionedEngine(0), reqs, n_samples=1, **SAMPLING)
    assert [g.unfinished for g in groups] == [True, True, False]  # 56*78 answered at once
    groups = rollout_agent.generate_turn(VersionedEngine(1), groups[:2], n_samples=1, **SAMPLING)
    assert [g.unfinished for g in groups] == [False, True]
    (last,) = rollout_agent.generate_turn(VersionedEngine(1), groups[1:], n_samples=1, **SAMPLING)
    samples = [s for g in groups for s in g.samples]
    m = agent_metrics(samples)
    assert m["rollout/tool_calls_per_response"] == 3 / 2 and m["rollout/tool_errors_per_response"] == 1 / 2
    assert m["rollout/turns_per_response"] == 5 / 2 and m["rollout/multi_version_frac"] == 1.0
    assert agent_metrics([{"response_ids": [1]}]) == {}  # a single-turn task's samples: none


def test_the_eval_line_and_the_summary_carry_the_tools_counts(tmp_path, monkeypatch):
    from epic_slime.runtime.cli import end_of_run_lines
    from epic_slime.runtime.eval_queue import EvalQueue
    from epic_slime.runtime.run_files import RunLog, run_outcome

    cfg = parse_config(["--task-name", "calc", "--output-dir", str(tmp_path), "--n-samples-per-eval-prompt", "2"])
    assert EvalQueue(cfg, None)._sampling()["max_turns"] == cfg.agent_max_turns
    log, queue = RunLog(cfg), EvalQueue(cfg, None)
    queue.log = log
    correct, stats, counts = _eval(monkeypatch)
    import ray

    monkeypatch.setattr(ray, "get", lambda fut: fut)
    queue.future, queue.future_version = (7, correct, stats, counts), 7
    queue.collect(step=7)
    line = queue.take_done()
    assert line["eval/heldout/mean@2"] == pytest.approx(4 / 6) and line["eval/version"] == 7
    assert line["eval/heldout/tool_errors_per_response"] == pytest.approx(1 / 3)
    summary = run_outcome(tmp_path, cfg)
    assert summary["eval_final"] == pytest.approx(4 / 6)
    assert summary["eval_final_tool"] == pytest.approx(stats)
    text = "\n".join(
        end_of_run_lines(
            {
                **summary,
                "steps_this_run": 7,
                "start_step": 0,
                "steps": 7,
                "loop_s": 1.0,
                "trained_samples_per_s": 1.0,
                "accounting/dropped": 0,
                "accounting/lost": 0,
            },
            cfg,
        )
    )
    assert "tool use at the last eval, per response: tool_calls 1.00, tool_errors 0.33, turns 2.00" in text


def test_the_agent_tasks_config_rules_name_the_field_and_value():
    cfg = parse_config(["--task-name", "calc"])
    assert cfg.agent_max_turns == 3 and cfg.agent_eval_tool is True
    with pytest.raises(ConfigError, match=r"^agent_max_turns: invalid value 0"):
        parse_config(["--task-name", "calc", "--agent-max-turns", "0"])
    with pytest.raises(ConfigError, match=r"task_name='calc' with policy_loss=dppo_topk_tv"):
        parse_config(["--task-name", "calc", "--policy-loss", "dppo_topk_tv"])
    with pytest.raises(ConfigError, match=r"^warm_start_init='w.pt' is not supported with task_name='calc'"):
        parse_config(["--task-name", "calc", "--warm-start-init", "w.pt"])


def test_one_warm_start_serves_agent_train_and_the_runtime(tmp_path):
    """``agent_train.warm_start`` and the runtime's cached warm start (``--task-name calc``) are the same
    function at the same settings: the same weights."""
    from epic_slime.runtime import agent_train
    from epic_slime.runtime.warmstart import warm_start_for

    run = agent_train.AgentRun(warm_steps=2, warm_batch=4)
    direct = agent_train.warm_start(3, run)
    cfg = parse_config(
        ["--task-name", "calc", "--seed", "3", "--warm-start-steps", "2", "--warm-start-batch-size", "4"]
        + ["--warm-start-lr", str(run.warm_lr), "--warm-start-cache-dir", str(tmp_path), "--no-progress"]
    )
    cached, provenance = warm_start_for(cfg)
    assert provenance.startswith("trained:")
    assert direct.keys() == cached.keys() and all(torch.equal(direct[k], cached[k]) for k in direct)
    untrained = task_calc.supervised_warm_start(cfg.model, steps=0, batch_size=4, lr=1e-3, seed=3)
    assert not all(torch.equal(direct[k], untrained[k]) for k in direct)  # the two steps did train


def test_the_committed_reference_run_trained_each_prompt_once_with_lags_from_the_oldest_token():
    """docs/agent_task/runtime_run/ (the config's run, cited by docs/agents.md): its batches obey the
    same rules as the end-to-end test's, and its summary carries the last evaluation's tool counts."""
    import json

    from support.runtime_helpers import REPO, read_jsonl

    ref = REPO / "docs/agent_task/runtime_run"
    cfg = parse_config(["--config", str(REPO / "configs/local/agent_calc.yaml")])
    batches = read_jsonl(ref / "batches.jsonl")
    trained = [gid for b in batches for gid in b["trained_group_ids"]]
    assert trained == list(range(cfg.num_rollout * cfg.rollout_batch_size))
    spanning = 0
    for b in batches:
        for lag, versions in zip(b["lags"], b["model_versions"], strict=True):
            assert lag == b["step"] - 1 - min(versions) <= cfg.max_staleness
            spanning += len(versions) > 1
    assert spanning > 0
    summary = json.loads((ref / "summary.json").read_text())
    last = read_jsonl(ref / "eval_metrics.jsonl")[-1]
    assert summary["eval_final_tool"] == {k.split("/")[-1]: v for k, v in last.items() if k.endswith("_per_response")}
    # the run is the config's: every value equal but where the output went and what it printed
    run_cfg = json.loads((ref / "config.json").read_text())
    where = {"output_dir", "warm_start_cache_dir", "progress", "plots", "versions"}
    assert {k: v for k, v in run_cfg.items() if k not in where} == {
        k: v for k, v in cfg.to_dict().items() if k not in where
    }


def test_the_reference_config_is_the_agent_train_settings():
    """configs/local/agent_calc.yaml keeps agent_train's warm start and RL settings (one recipe)."""
    from epic_slime.runtime.agent_train import RUN
    from support.runtime_helpers import REPO

    cfg = parse_config(["--config", str(REPO / "configs/local/agent_calc.yaml")])
    assert (cfg.warm_start_steps, cfg.warm_start_batch_size, cfg.warm_start_lr) == (
        RUN.warm_steps,
        RUN.warm_batch,
        RUN.warm_lr,
    )
    assert (cfg.lr, cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.update_depth) == (
        RUN.rl_lr,
        RUN.prompts_per_step,
        RUN.samples_per_prompt,
        RUN.update_depth,
    )
    assert (cfg.agent_max_turns, cfg.rollout_max_response_len, cfg.policy_loss) == (
        RUN.max_turns,
        RUN.max_new_tokens,
        RUN.policy_loss,
    )
    assert (cfg.num_rollout, cfg.n_samples_per_eval_prompt, cfg.task_eval_num_prompts) == (
        RUN.rl_steps,
        RUN.eval_samples,
        RUN.eval_prompts,
    )


class _Worker:
    """A rollout worker's interface as the pool calls it: ``generate.remote(...)`` returns a future."""

    class generate:  # noqa: N801
        @staticmethod
        def remote(requests, weights, version, sampling):
            return ("turn", tuple(g.group_id for g in requests))


def test_groups_between_turns_on_a_worker_that_dies_are_counted_lost_and_leave_the_budget(monkeypatch):
    """The continuing groups' last exit: their worker dies during their next turn. They are counted
    lost (samples), leave the budget, and no batch waits for them any more."""
    import ray

    from epic_slime.runtime.batches import Group
    from epic_slime.runtime.rollout_pool import RolloutPool

    cfg = parse_config(["--task-name", "calc", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2"])
    pool = RolloutPool(cfg)
    monkeypatch.setattr(pool, "_new_worker", lambda i: _Worker)
    pool.start(None)
    full = pool.budget.room(0)
    pool.budget.start(3)
    pool.next_group_id = 3
    pool.continuing = [Group(g, 0, [{}, {}], unfinished=True) for g in (0, 1, 2)]
    assert pool.first_unfinished() == 0  # a batch waits for groups between turns too
    pool.fill()  # two workers, two groups per request: the continuing groups go first, no new prompt
    assert sorted(reqs[0].group_id for _, reqs, _ in pool.pending.values()) == [0, 2] and not pool.continuing
    assert pool.next_group_id == 3 and pool.first_unfinished() == 0
    dead = next(f for f, (_, reqs, _) in pool.pending.items() if reqs[0].group_id == 0)

    def died(fut):
        raise ray.exceptions.RayActorError()

    monkeypatch.setattr(ray, "get", died)
    pool.collect(dead)
    assert pool.acc.lost == 4 and pool.acc.worker_restarts == 1 and pool.acc.generated == 0
    assert pool.budget.room(0) == full - 1  # groups 0 and 1 left it; group 2 is still live
    assert pool.first_unfinished() == 2
