"""Synthetic task, tokenizer and exact verifier (no Ray, no model)."""

import re

import pytest

from epic_slime.runtime.task import ANSWER, TaskConfig, Tokenizer, answer_reward, make_problem, parse_answer
from epic_slime.runtime.task_arith import is_heldout
from epic_slime.runtime.tasks import TASKS, eval_problems, get_task, split_problems, train_problem, validate_task_config


def _left_to_right(prompt: str) -> int:
    nums = [int(x) for x in re.findall(r"\d+", prompt)]
    ops = re.findall(r"[+\-*]", prompt)
    acc = nums[0]
    for op, b in zip(ops, nums[1:]):
        acc = acc + b if op == "+" else acc - b if op == "-" else acc * b
    return acc


def test_tokenizer_round_trip_and_answer_token():
    tok = Tokenizer()
    text = "3+5=8;8-12=-4;Answer:-4"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids.count(tok.answer_id) == 1
    assert tok.decode(ids + [tok.eos_id, tok.token_to_id["7"]]) == text  # stops at <eos>
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("3x5")


@pytest.mark.parametrize("ops", ["+-", "+-*"])
def test_problems_are_correct_and_deterministic(ops):
    cfg = TaskConfig(ops=ops, max_operands=4)
    for i in range(300):
        p = train_problem(i, seed=3, cfg=cfg)
        assert p == train_problem(i, seed=3, cfg=cfg)
        assert p.answer == _left_to_right(p.prompt)
        assert p.solution.endswith(f"{ANSWER}{p.answer}")
        assert p.prompt.endswith("=") and 2 <= len(re.findall(r"\d+", p.prompt)) <= 4
        # every step line is a true equation
        for a, op, b, c in re.findall(r"(-?\d+)([+\-*])(\d+)=(-?\d+);", p.solution):
            assert eval(f"{a}{op}{b}") == int(c)
    assert any(train_problem(i, 3, cfg) != train_problem(i, 4, cfg) for i in range(10))  # seeds differ


def test_heldout_split_is_disjoint_from_training():
    cfg = TaskConfig()
    held = eval_problems(cfg)
    assert len(held) == cfg.eval_num_prompts == len({p.prompt for p in held})
    assert all(is_heldout(p.prompt, cfg) for p in held)
    train_prompts = {train_problem(i, 1, cfg).prompt for i in range(3000)}
    assert not train_prompts & {p.prompt for p in held}
    assert eval_problems(cfg) == held  # seed-independent, fixed


def test_too_many_eval_prompts_is_a_clear_error():
    with pytest.raises(ValueError, match="task_eval_num_prompts"):
        eval_problems(TaskConfig(max_operands=2, max_operand=3, eval_num_prompts=500))


def test_exact_verifier():
    tok = Tokenizer()
    enc = lambda s: tok.encode(s) + [tok.eos_id]  # noqa: E731
    assert answer_reward(enc("3+5=8;Answer:8"), 8, tok) == 1.0
    assert answer_reward(enc("3+5=8;Answer:-8"), -8, tok) == 1.0
    assert answer_reward(enc("3+5=8;Answer:9"), 8, tok) == 0.0
    assert answer_reward(enc("3+5=8;Answer:8;"), 8, tok) == 0.0  # answer must end the response
    assert answer_reward(enc("Answer:7Answer:8"), 8, tok) == 1.0  # the final answer counts
    assert answer_reward(tok.encode("3+5=8;Answer:8"), 8, tok) == 0.0  # truncated: no <eos>
    assert answer_reward(enc("88"), 8, tok) == 0.0
    assert parse_answer("Answer:") is None and parse_answer("Answer:12") == 12
    p = make_problem([7, 9, 5], ["+", "-"])
    assert answer_reward(enc(p.solution), p.answer, tok) == 1.0 and p.answer == 11


def test_the_registry_names_each_task_once_and_checks_its_limits():
    assert sorted(TASKS) == ["arith", "calc", "chain", "chain_long", "fib"]
    assert get_task("chain").modulus == 10 and get_task("arith").modulus is None
    # the stress ladder's long variant: the chain task's problems, longer chains allowed
    validate_task_config(TaskConfig(name="chain_long", min_operands=34, max_operands=34))
    with pytest.raises(ValueError, match="<= 40"):
        validate_task_config(TaskConfig(name="chain_long", min_operands=34, max_operands=41))
    long = train_problem(3, 1, TaskConfig(name="chain_long", min_operands=34, max_operands=34))
    assert long.solution.count(";") == 33 and len(long.solution) >= 199
    with pytest.raises(
        ValueError, match="task_name must be one of \\['arith', 'calc', 'chain', 'chain_long', 'fib'\\], got 'poetry'"
    ):
        get_task("poetry")
    validate_task_config(TaskConfig(name="chain", min_operands=12, max_operands=14))
    with pytest.raises(ValueError, match="<= 6"):
        validate_task_config(TaskConfig(max_operands=7))  # the arithmetic task's own limit
    with pytest.raises(ValueError, match="<= 14"):
        validate_task_config(TaskConfig(name="chain", min_operands=12, max_operands=15))
    # dispatch by name: the chain task's stream differs from the arithmetic one for the same (index, seed)
    assert (
        train_problem(3, 1, TaskConfig(name="chain", min_operands=9, max_operands=9)).prompt.count("+")
        + train_problem(3, 1, TaskConfig(name="chain", min_operands=9, max_operands=9)).prompt.count("-")
        == 8
    )


# ---- from issue 46's fresh mutation pass: train/test disjointness for every task in the registry, and
# the exported tokenizer's round trip on each task's own text (each test names its mutants)
def _task_config(name: str) -> TaskConfig:
    task = TASKS[name]
    if name == "fib":  # N steps stated by the config, not the prompt: min = max
        return TaskConfig(name=name, min_operands=6, max_operands=6, eval_num_prompts=10)
    return TaskConfig(name=name, max_operands=min(4, task.max_operands), eval_num_prompts=32)


# mutants: fib_train_starts_unfiltered, chain_train_checks_only_validation, arith_train_keeps_heldout
@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_tasks_training_problems_never_meet_its_held_out_or_test_prompts(name):
    cfg = _task_config(name)
    held = {p.prompt for p in eval_problems(cfg)}
    assert len(held) == cfg.eval_num_prompts
    if TASKS[name].split_problems is not None:
        validation = {p.prompt for p in split_problems("validation", cfg)}
        test = {p.prompt for p in split_problems("test", cfg)}
        assert len(test) == cfg.eval_num_prompts and not validation & test
        held |= validation | test
    train = [train_problem(i, seed, cfg).prompt for seed in (1, 2, 3) for i in range(800)]
    assert not set(train) & held, sorted(set(train) & held)[:5]
    assert len(set(train)) > 1


# mutants: hf_tokenizer_answer_split, hf_tokenizer_decoder_spaces
@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_exported_tokenizer_gives_the_task_tokenizers_ids_and_text_back(name, tmp_path):
    """The Hugging Face tokenizer SGLang loads: the same ids as the task's tokenizer on its prompts and
    solutions (`Answer:` one token, every operator and digit), and the text back from them, after a save
    and a load as SGLang does it."""
    pytest.importorskip("tokenizers", reason="the HF export needs tokenizers (the [test] extra)")
    transformers = pytest.importorskip("transformers", reason="the HF export needs transformers")
    from epic_slime.runtime.hf_export import hf_tokenizer

    hf_tokenizer().save_pretrained(tmp_path)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok = Tokenizer()
    cfg = _task_config(name)
    texts = [
        t for i in range(40) for p in [train_problem(i, 1, cfg)] for t in (p.prompt, p.solution, p.prompt + p.solution)
    ]
    texts += ["Answer:-12", "3*4=12;Answer:12", "9-9=0;Answer:0"]
    answer_id = tok.encode("Answer:")
    assert answer_id == [tok.answer_id]
    for text in texts:
        ids = tok.encode(text)
        assert exported.encode(text, add_special_tokens=False) == ids, text
        assert exported.decode(ids) == text == tok.decode(ids)
    assert any("Answer:" in t for t in texts) and any(op in t for t in texts for op in "+-")
