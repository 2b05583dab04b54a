"""Issue 46: the embedded runtime's parts a fresh mutation pass found unpinned. The TIS truncation
fraction against a count made by hand, the lr warmup after `load_state`, train/test disjointness for
every task in the registry, and the exported tokenizer's round trip on each task's own text."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.tasks import TASKS, eval_problems, split_problems, train_problem
from support.runtime_helpers import tiny_trainer

# ---- pattern 8: the runtime's TIS truncation fraction, worked out by hand ----


def test_the_runtime_tis_truncated_fraction_is_the_hand_counted_share_of_valid_tokens():
    """Every 3rd valid token gets mu = pi_old - log 3 (weight 3, truncated to C = 1.5); every other valid
    token mu = pi_old (weight 1). The fraction is then a count over the valid tokens (responses have
    different lengths: padding must not count) and the mean weight follows from the same count."""
    trainer, samples, _ = tiny_trainer(update_depth=1, use_tis=True, tis_clip=1.5, lr=0.0)
    old = trainer._old_log_probs(samples)
    truncated = valid = 0
    shifted = []
    for s in samples:
        lp = list(old[id(s)])
        mu = []
        for j, x in enumerate(lp):
            if j % 3 == 0:
                mu.append(x - math.log(3.0))
                truncated += 1
            else:
                mu.append(x)
            valid += 1
        shifted.append({**s, "behavior_log_probs": mu})
    lengths = {len(s["response_ids"]) for s in samples}
    assert len(lengths) > 1, "the hand count needs padding: responses of different lengths"
    metrics = trainer.train_step(shifted)
    frac = truncated / valid
    assert metrics["train/tis_truncated_frac"] == pytest.approx(frac, abs=1e-6)
    assert metrics["train/tis_weight_mean"] == pytest.approx(1.5 * frac + 1.0 * (1 - frac), rel=1e-5)


# ---- pattern 9: where the lr warmup stands after load_state ----


def test_a_loaded_trainer_continues_the_lr_warmup_where_the_saved_one_stood():
    """Warmup over 8 Adam steps, 2 per train step: after one step the saved trainer stands at Adam step 2.
    The one loaded from its state trains step 2 at lr (3/8, 4/8), as the uninterrupted one does, and
    ends with the same weights (a warmup restarted at 0 would train at 1/8, 2/8)."""
    lr, warmup = 1e-3, 8
    a, samples, _ = tiny_trainer(lr=lr, lr_warmup_steps=warmup, update_depth=2)
    a.train_step(samples)
    saved = copy.deepcopy(a.state())
    b, _, _ = tiny_trainer(lr=lr, lr_warmup_steps=warmup, update_depth=2)
    b.load_state(saved)
    assert b.adam_steps == 2
    m_b = b.train_step(samples)
    m_a = a.train_step(samples)
    assert m_b["train/lr"] == pytest.approx(lr * (3 / 8 + 4 / 8) / 2, rel=1e-12)
    assert m_a["train/lr"] == pytest.approx(m_b["train/lr"], rel=1e-12)
    assert b.opt.param_groups[0]["lr"] == pytest.approx(lr * 4 / 8, rel=1e-12)
    for (name, wa), wb in zip(a.get_weights().items(), b.get_weights().values()):
        assert torch.equal(wa, wb), name


# ---- pattern 10: train and test problems disjoint, for every task ----


def _task_config(name: str) -> TaskConfig:
    task = TASKS[name]
    if name == "fib":  # N steps stated by the config, not the prompt: min = max
        return TaskConfig(name=name, min_operands=6, max_operands=6, eval_num_prompts=10)
    return TaskConfig(name=name, max_operands=min(4, task.max_operands), eval_num_prompts=32)


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


# ---- pattern 11: the exported tokenizer's round trip on the task's own text ----


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
