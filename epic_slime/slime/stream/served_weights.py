"""The project's push-name check: a weight push must name exactly the tensors the server loaded.

An SGLang 0.5.15 weight update answers ``{"success": true}`` for parameter names the engine cannot
map and loads nothing (transformers 5's fused in-memory expert names ``mlp.experts.gate_up_proj``; a
tied ``lm_head`` left out of the push). ``check_push_names`` refuses, before anything is sent, a push
whose names or shapes are not exactly those of the checkpoint the server loaded (``checkpoint_shapes``
of its HF folder): the server's success answer cannot be trusted for that. On the train ranks
(``install_push_name_check``, from the push-mode train hook) each bucket slime's distributed updater
broadcasts is checked before it is sent.

What the server serves after a push (its version, its log-probs) is probed by the tests
(tests/support/served_probe.py).

slime is imported only inside ``install_push_name_check``: the driver and the tests use the rest.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class PushNamesWrong(ValueError):
    """A push names a tensor the server does not load, leaves one out, or has another shape."""


def checkpoint_shapes(model_dir) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in the HF checkpoint folder ``model_dir`` (what SGLang loads),
    read from the safetensors headers."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint_shapes: no *.safetensors in {model_dir}")
    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def check_push_names(pushed: dict, served: dict) -> None:
    """Raise ``PushNamesWrong`` unless ``pushed`` (name -> tensor or shape) names exactly the tensors of
    ``served`` (name -> shape, ``checkpoint_shapes``) with their shapes."""
    check_push_chunk(pushed, served)
    missing = sorted(set(served) - set(pushed))
    if missing:
        raise PushNamesWrong(f"the push leaves out parameters the server serves: {missing}")


def check_push_chunk(pushed: dict, served: dict) -> None:
    """One part of a push (a bucket): every name one the server loads, with its shape."""
    unknown = sorted(set(pushed) - set(served))
    if unknown:
        raise PushNamesWrong(f"the push names parameters the server does not load: {unknown}")
    shape_of = {n: tuple(getattr(v, "shape", v)) for n, v in pushed.items()}
    wrong = {n: (shape_of[n], tuple(served[n])) for n in pushed if shape_of[n] != tuple(served[n])}
    if wrong:
        raise PushNamesWrong(f"the push's shapes differ from the served ones (pushed, served): {wrong}")


_CHECKED = "_epic_push_names_checked"


def checked_chunks(on_chunk, served_of):
    """slime's ``UpdateWeightFromDistributed._on_chunk`` (called with each HF chunk before it is
    broadcast) with the chunk checked first (``check_push_chunk``) against ``served_of(args)``.

    Per chunk, not per push: each pipeline stage pushes its own layers, so no one rank sees the whole
    push and a left-out tensor cannot be told from another stage's."""
    if getattr(on_chunk, _CHECKED, False):
        return on_chunk

    def wrapped(self, hf_chunk):
        served = served_of(self.args)
        if served is not None:
            check_push_chunk(dict(hf_chunk), served)
        return on_chunk(self, hf_chunk)

    setattr(wrapped, _CHECKED, True)
    return wrapped


_SERVED: dict = {}  # --hf-checkpoint -> its names and shapes (read once per process)


def served_shapes_of(args) -> dict | None:
    """The names and shapes the servers load: ``--hf-checkpoint``'s safetensors (slime starts them from
    it). None, with a warning once, when it holds no safetensors (a ``.bin`` checkpoint): unchecked."""
    folder = getattr(args, "hf_checkpoint", None)
    if folder not in _SERVED:
        try:
            _SERVED[folder] = checkpoint_shapes(folder) if folder else None
        except FileNotFoundError:
            _SERVED[folder] = None
        if _SERVED[folder] is None:
            logger.warning("push-name check off: --hf-checkpoint %r holds no *.safetensors to compare with", folder)
    return _SERVED[folder]


def install_push_name_check() -> None:
    """Every chunk slime's distributed updater broadcasts is checked first (idempotent): a push naming a
    parameter the server does not load, or with another shape, raises ``PushNamesWrong`` before it is
    sent, where the server would answer success and keep its old weights."""
    from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import UpdateWeightFromDistributed

    UpdateWeightFromDistributed._on_chunk = checked_chunks(UpdateWeightFromDistributed._on_chunk, served_shapes_of)
