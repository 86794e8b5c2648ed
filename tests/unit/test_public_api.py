"""The public API: users import from `engine` (Pruner, CallOptions, LoadOptions, the result
types, the errors), `import engine` loads none of it until a name is used, and Pruner's
public methods are the few a user and the Triton text model call."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_the_public_names_come_from_engine():
    import engine
    from engine.errors import InputError
    from engine.pipeline.results import PruneResult
    from engine.pruner import Pruner

    assert engine.Pruner is Pruner and engine.PruneResult is PruneResult and engine.InputError is InputError
    assert set(engine.__all__) >= {
        "Pruner",
        "CallOptions",
        "LoadOptions",
        "PruneResult",
        "Sentence",
        "PrunerProtocol",
        "PruneError",
        "InputError",
        "ModelLoadError",
        "BackendError",
    }
    assert all(getattr(engine, name) is not None for name in engine.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Prunr'"):
        engine.Prunr


def test_importing_engine_loads_nothing_until_a_name_is_used():
    code = (
        "import sys, engine; before = 'engine.pruner' in sys.modules; engine.Pruner; "
        "print(before, 'engine.pruner' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_a_pruner_offers_the_few_public_methods():
    from engine.pruner import Pruner

    public = {n for n in vars(Pruner) if not n.startswith("_")}
    assert public == {
        "load",
        "connect",
        "describe",
        "prune",
        "aprune",
        "prune_many",
        "prepare",
        "finish",
        "close",
    }
