"""`warm_start_init`: a warm start that starts from given weights (the mechanism study's long task starts
from the short task's warm start, a curriculum). The weights' content is in the cache key; bad files
get one-line errors naming the field."""

import pytest
import torch

from epic_slime.runtime.config import parse_config
from epic_slime.runtime.model import ModelConfig, build_policy
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.warmstart import load_or_train_warm_start, warm_start_key

TINY = ModelConfig(
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    num_experts=2,
    top_k=1,
    moe_intermediate_size=16,
    max_positions=64,
)


def _weights(seed: int, model_cfg: ModelConfig = TINY) -> dict:
    tok = Tokenizer()
    model = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _train(tmp_path, init, steps=1, lr=1e-12):
    return load_or_train_warm_start(
        TINY, TaskConfig(), steps=steps, lr=lr, batch_size=2, seed=0, cache_dir=tmp_path / "cache", init=init
    )


def test_the_warm_start_starts_from_the_init_weights_not_a_fresh_model(tmp_path):
    start = _weights(seed=7)  # another seed than the warm start's own (0)
    torch.save(start, tmp_path / "init.pt")
    from_init, _ = _train(tmp_path, tmp_path / "init.pt")
    fresh, _ = _train(tmp_path, None)
    assert _max_diff(from_init, start) < 1e-6  # one step at lr 1e-12 leaves the weights where they began
    assert _max_diff(fresh, start) > 1e-2  # a fresh model (seed 0) is elsewhere


def test_the_init_files_content_is_in_the_cache_key_only_when_set(tmp_path):
    m, t = TINY, TaskConfig()
    assert warm_start_key(m, t, 1, 1e-3, 2, 0, 0.0, 0.0) == warm_start_key(m, t, 1, 1e-3, 2, 0, 0.0, 0.0, None)
    assert warm_start_key(m, t, 1, 1e-3, 2, 0, 0.0, 0.0, "ab") != warm_start_key(m, t, 1, 1e-3, 2, 0, 0.0, 0.0, "cd")
    torch.save(_weights(seed=1), tmp_path / "init.pt")
    first, how = _train(tmp_path, tmp_path / "init.pt")
    assert how.startswith("trained:")
    assert _train(tmp_path, tmp_path / "init.pt")[1] == how.replace("trained:", "cache:")
    torch.save(_weights(seed=2), tmp_path / "init.pt")  # same path, other weights: trained again
    second, how2 = _train(tmp_path, tmp_path / "init.pt")
    assert how2.startswith("trained:") and how2 != how
    assert _max_diff(first, second) > 1e-2


def test_a_missing_or_misfitting_init_file_is_a_one_line_error_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^warm_start_init: cannot read weights from '.*nowhere\.pt'") as e:
        _train(tmp_path, tmp_path / "nowhere.pt")
    assert "\n" not in str(e.value)
    torch.save(
        _weights(
            seed=0,
            model_cfg=ModelConfig(
                hidden_size=32,
                num_layers=1,
                num_heads=2,
                num_kv_heads=1,
                num_experts=2,
                top_k=1,
                moe_intermediate_size=16,
                max_positions=64,
            ),
        ),
        tmp_path / "wide.pt",
    )
    with pytest.raises(ValueError, match=r"^warm_start_init: the weights do not fit this model") as e:
        _train(tmp_path, tmp_path / "wide.pt")
    assert "\n" not in str(e.value)
    (tmp_path / "text.pt").write_text("not weights")
    with pytest.raises(ValueError, match=r"^warm_start_init: cannot read weights"):
        _train(tmp_path, tmp_path / "text.pt")
    torch.save(_weights(seed=0), tmp_path / "init.pt")
    with pytest.raises(ValueError, match=r"^warm_start_init: .*needs warm_start_steps > 0 \(got 0\)"):
        _train(tmp_path, tmp_path / "init.pt", steps=0)


def test_the_flag_parses_and_defaults_to_none(tmp_path):
    assert parse_config(["--output-dir", str(tmp_path / "a")]).warm_start_init is None
    cfg = parse_config(["--output-dir", str(tmp_path / "b"), "--warm-start-init", "w.pt"])
    assert cfg.warm_start_init == "w.pt"
