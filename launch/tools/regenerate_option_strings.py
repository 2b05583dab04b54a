"""Regenerate ``epic_slime/slime/cli/option_strings.json`` from the real parsers at the pinned versions.

The driver and the dry run check every flag against the option strings of the three parsers a
slime command line goes through (see ``epic_slime/slime/cli/option_strings.py``). This script builds
those parsers with their own code and stores ``{option string: kind}`` for each:

- ``megatron``: Megatron-LM's ``megatron.training.arguments.add_megatron_arguments`` (the parser of
  ``parse_args``) at the commit the image pins, with slime's Megatron patch applied;
- ``slime``: the options slime's ``get_slime_extra_args_provider()`` adds to that parser, plus the
  options of slime's pre-parse (``_pre_parse_mode``: ``--train-backend``, ``--debug-*``, ...);
- ``sglang``: slime's SGLang parser (``add_sglang_arguments``: SGLang's ``ServerArgs`` flags with
  the ``--sglang-`` prefix, the router flags, ``--sglang-config``, ...).

Inside the image (everything installed, Megatron-LM in /root/Megatron-LM, slime in /root/slime):

    python launch/tools/regenerate_option_strings.py --megatron /root/Megatron-LM --slime /root/slime

Without the image, on CPU (what produced the stored file; no GPU; the parsers build in ~20 s):

    # slime: a checkout at the pinned commit (or ../shared/vendor/slime-624b824a)
    # Megatron-LM at the image's commit (slime's docker/Dockerfile: MEGATRON_COMMIT) + slime's patch
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/mlm && git -C /tmp/mlm checkout 1dcf0dafa884ad52ffb243625717a3471643e087
    git -C /tmp/mlm apply --include=megatron/training/arguments.py <slime>/docker/patch/latest/megatron.patch
    # SGLang and its router without their dependencies, plus the few light modules their imports need
    pip download --no-deps sglang==0.5.15.post1 sglang-router==0.3.2 -d /tmp/whl
    mkdir /tmp/sg && for w in /tmp/whl/*.whl; do python -m zipfile -e $w /tmp/sg; done
    pip install --no-deps --target /tmp/sgdeps six triton orjson psutil pybase64 starlette IPython \
        traitlets pyzmq dill openai sniffio partial_json_parser msgspec sentencepiece setproctitle \
        uvicorn fastapi opentelemetry-api wandb xxhash
    python launch/tools/regenerate_option_strings.py --megatron /tmp/mlm --slime <slime> \
        --site /tmp/sg --site /tmp/sgdeps --stub-torchvision

``--stub-torchvision``: SGLang imports ``torchvision`` (image transforms) at module level and the
PyPI torchvision does not load against a CPU torch; the flag puts a placeholder ``torchvision`` in
front of the import system (nothing of it is called while building a parser) and lets
transformers' ``Auto*.register`` accept SGLang's re-registration of configs that a newer
transformers already ships. Use it only where the real torchvision cannot be imported.

The image's router is zhuzilin's sgl-router build 0.3.2-9daabcd; PyPI's sglang-router 0.3.2 is
the closest public one (regenerate inside the image for the exact set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "epic_slime" / "slime" / "cli" / "option_strings.json"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
MEGATRON_COMMIT = "1dcf0dafa884ad52ffb243625717a3471643e087"


def _install_torchvision_placeholder() -> None:
    """A ``torchvision`` whose every attribute is an inert placeholder (see the module docstring)."""
    import importlib.abc
    import importlib.machinery
    import types

    import transformers.utils.import_utils  # noqa: F401  (decides torchvision availability first: absent)

    class Placeholder:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args, **kwargs):
            return Placeholder()

        def __getattr__(self, name):
            return Placeholder()

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = module_getattr
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())
    from transformers import AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer

    for cls in (AutoConfig, AutoImageProcessor, AutoProcessor, AutoTokenizer):
        original = cls.register

        def tolerant_register(*args, _original=original, **kwargs):
            return _original(*args, **{**kwargs, "exist_ok": True})

        cls.register = staticmethod(tolerant_register)


def collect(stub_torchvision: bool) -> dict:
    """Runs in the child process with Megatron-LM, slime and SGLang importable."""
    if stub_torchvision:
        _install_torchvision_placeholder()
    from megatron.training.arguments import add_megatron_arguments
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.utils import arguments as slime_arguments

    from epic_slime.slime.cli.option_strings import option_kinds_of

    megatron_parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(megatron_parser)
    megatron = option_kinds_of(megatron_parser)

    slime_arguments.get_slime_extra_args_provider(None)(megatron_parser)
    slime = {o: k for o, k in option_kinds_of(megatron_parser).items() if o not in megatron}
    saved = sys.argv
    sys.argv = [saved[0]]
    try:
        pre = slime_arguments._pre_parse_mode()
    finally:
        sys.argv = saved
    for dest, default in vars(pre).items():
        slime["--" + dest.replace("_", "-")] = "flag" if isinstance(default, bool) else "value"

    sglang_parser = argparse.ArgumentParser(add_help=False)
    add_sglang_arguments(sglang_parser)
    sglang = option_kinds_of(sglang_parser)

    import sglang as sglang_package

    try:
        from sglang_router.version import __version__ as router_version
    except ImportError:
        router_version = "unknown"
    return {
        "versions": {
            "slime": SLIME_COMMIT,
            "megatron": f"{MEGATRON_COMMIT} + slime docker/patch/latest/megatron.patch",
            "sglang": getattr(sglang_package, "__version__", "unknown"),
            "sglang_router": router_version,
        },
        "parsers": {
            "megatron": dict(sorted(megatron.items())),
            "slime": dict(sorted(slime.items())),
            "sglang": dict(sorted(sglang.items())),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--megatron", required=True, help="Megatron-LM source tree (the folder holding megatron/)")
    parser.add_argument("--slime", required=True, help="slime source tree (the folder holding slime/)")
    parser.add_argument("--site", action="append", default=[], help="extra import folder (repeatable)")
    parser.add_argument("--stub-torchvision", action="store_true")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        json.dump(collect(args.stub_torchvision), sys.stdout)
        return 0
    # A child process with exactly these import paths: the parsers' modules must not mix with
    # whatever megatron-core / slime the calling environment has installed.
    path = os.pathsep.join([args.megatron, args.slime, *args.site, str(REPO)])
    child = [sys.executable, "-W", "ignore", __file__, "--child", "--megatron", args.megatron, "--slime", args.slime]
    if args.stub_torchvision:
        child.append("--stub-torchvision")
    result = subprocess.run(child, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        print(result.stderr[-4000:], file=sys.stderr)
        return result.returncode
    data = json.loads(result.stdout.strip().splitlines()[-1])
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    counts = {name: len(options) for name, options in data["parsers"].items()}
    print(f"wrote {args.out}: {counts} option strings; versions {data['versions']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
