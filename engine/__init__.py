"""Context pruning and semantic highlighting with an accelerated core.

    from engine import Pruner
    pruner = Pruner.load("default")                  # or an exported folder; Pruner.connect(...) for Triton
    results = pruner.prune("Why does sourdough bread taste sour?", passages)

The public names, imported from here: `Pruner`, `Compressor` (LLMLingua-2, and its
`CompressResult`), `CallOptions` (a call's options),
`LoadOptions` (how a model of either kind is opened), `PruneResult` and `Sentence` (what a call
returns), `PrunerProtocol` and `CompressorProtocol` (what every pruner and every compressor
offers), and the errors (`PruneError` and its
kinds). Each is loaded on first use, so `import engine` costs nothing until then.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: the public names and the modules that define them
_PUBLIC = {
    "Pruner": "engine.pruner",
    "Compressor": "engine.compressor",
    "CompressResult": "engine.pipeline.lingua_decide",
    "CallOptions": "engine.pipeline.inputs",
    "LoadOptions": "engine.models.loading",
    "PruneResult": "engine.pipeline.results",
    "Sentence": "engine.pipeline.results",
    "PrunerProtocol": "engine.protocol",
    "CompressorProtocol": "engine.protocol",
    "PruneError": "engine.errors",
    "InputError": "engine.errors",
    "ModelLoadError": "engine.errors",
    "BackendError": "engine.errors",
    "ExportError": "engine.errors",
    "SettingError": "engine.errors",
    "Cancelled": "engine.errors",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
