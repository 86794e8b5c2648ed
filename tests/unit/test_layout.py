"""The package's import rules (docs/development.md), read from the source with `ast`.

Every import statement counts, at module level or inside a function (a lazy import is
still a dependency of whoever calls that function). Importlib calls with a string are
not seen: `engine.models.default_model` exports the default model on first use that way, and
says so."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


ROOT = Path(__file__).resolve().parents[2]


def _modules(*patterns: str) -> list[Path]:
    return sorted({p for pat in patterns for p in ROOT.glob(pat) if p.name != "__main__.py"})


def imports(path: Path) -> set[str]:
    """Every module name an import statement of `path` names (`from a.b import c` gives
    a.b and a.b.c: c may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _hits(names: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


#: the client-safe spine: what a torch-free client, the Triton text model and the HTTP API run
SPINE = _modules("engine/*.py", "engine/pipeline/*.py", "engine/machine/*.py", "engine/models/*.py")
CLIENT_SAFE = SPINE + _modules(
    "engine/backends/base.py",
    "engine/backends/onnxruntime.py",
    "engine/backends/triton.py",
    "engine/triton/*.py",
    "engine/remote/*.py",
)
#: who may import the torch modelling (engine.pytorch)
TORCH_MODELLING_USERS = _modules(
    "engine/pytorch/*.py",
    "engine/backends/torch.py",
    "export/*.py",
    "engine/cli/fidelity.py",
    "engine/bench/peers.py",
)
#: everything below the CLI, what a server runs among it: may not import the measuring tools
#: (prune bench, prune eval) or the RAG application (the framework adapters sit beside the CLI:
#: their embeddings are the RAG encoder's)
BELOW_CLI = [
    p
    for p in _modules("engine/**/*.py", "triton_models/*/model.py")
    if not {"cli", "bench", "evaluate", "rag", "integrations"} & set(p.relative_to(ROOT).parts)
]
FRAMEWORKS = (
    "langchain",
    "langchain_core",
    "langchain_classic",
    "llama_index",
    "haystack",
    "litellm",
    "engine.integrations",
)

IMPORT_RULES = {
    "the spine, backends/{base,onnxruntime,triton}, triton/ and remote/ never import torch, transformers or export": (
        CLIENT_SAFE,
        ("torch", "transformers", "export"),
    ),
    "only backends/torch, export/, prune fidelity and the bench's peers import the torch modelling (engine.pytorch)": (
        [p for p in _modules("engine/**/*.py", "triton_models/*/model.py") if p not in TORCH_MODELLING_USERS],
        ("engine.pytorch",),
    ),
    "nothing below the CLI (no server) imports bench/, evaluate/ or rag/": (
        BELOW_CLI,
        ("engine.bench", "engine.evaluate", "engine.rag"),
    ),
    "only the adapters import the RAG frameworks, and nothing imports the adapters": (
        [
            p
            for p in _modules("engine/**/*.py", "export/*.py", "triton_models/*/model.py")
            if "integrations" not in p.relative_to(ROOT).parts
        ],
        FRAMEWORKS,
    ),
    "nothing installed imports the benchmarks or the developer tools (a clone's, not in the wheel)": (
        _modules("engine/**/*.py", "export/*.py", "triton_models/*/model.py"),
        ("benchmarks", "dev"),
    ),
    "the exporter never imports the measuring tools (--precision auto gates and times with the engine's own)": (
        _modules("export/*.py"),
        ("engine.bench", "engine.evaluate"),
    ),
}


def violations(files: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for path in files:
        hits = _hits(imports(path), forbidden)
        if hits:
            out[str(path.relative_to(ROOT))] = hits
    return out


@pytest.mark.parametrize("rule", list(IMPORT_RULES))
def test_import_rule(rule):
    files, forbidden = IMPORT_RULES[rule]
    assert files, "the rule covers no file: the layout moved under it"
    assert violations(files, forbidden) == {}, rule


@pytest.mark.parametrize(
    "package, allowed",
    [
        ("pipeline", ("engine.errors", "engine.settings", "engine.pipeline")),
        ("machine", ("engine.errors", "engine.settings", "engine.pipeline", "engine.machine")),
    ],
)
def test_the_pipeline_and_the_machine_stand_on_their_own(package, allowed):
    """engine.pipeline (text to input, output to decisions) imports of the engine only the
    errors, the settings and itself; engine.machine adds the pipeline: neither reaches a
    backend, the pruner or a transport, so the Triton text model and a remote client run them
    as they are."""
    reached = {
        str(p.relative_to(ROOT)): sorted(
            n for n in imports(p) if n.split(".")[0] in ("engine", "export") and not _hits({n}, allowed)
        )
        for p in _modules(f"engine/{package}/*.py")
    }
    assert reached and {k: v for k, v in reached.items() if v} == {}


def test_the_rules_see_lazy_imports(tmp_path):
    """A function-level import is caught as well as a module-level one."""
    f = tmp_path / "m.py"
    f.write_text("import numpy\n\ndef later():\n    from torch import nn\n    import export.onnx\n")
    assert _hits(imports(f), ("torch", "export")) == ["export.onnx", "torch", "torch.nn"]


def test_the_layout_has_the_documented_packages():
    for pkg in (
        "engine/pipeline",
        "engine/machine",
        "engine/models",
        "engine/backends",
        "engine/triton",
        "engine/remote",
        "engine/pytorch",
        "engine/bench",
        "engine/evaluate",
        "engine/rag",
        "engine/integrations",
        "engine/cli",
    ):
        assert (ROOT / pkg / "__init__.py").is_file(), pkg
    text = (ROOT / "docs" / "development.md").read_text()
    for module in [*_modules("engine/*.py"), *_modules("engine/*/*.py"), *_modules("export/*.py")]:
        if module.name != "__init__.py":
            assert module.stem in text, f"docs/development.md's layout omits {module.relative_to(ROOT)}"


# ---------------------------------------------------------------------- import direction

#: the layers, lowest first (docs/development.md): a module imports its own layer and the
#: ones below, never one above. An entry names one module, or ends in ".*" for a package
#: whose modules are all of its layer; the top-level modules are named one by one, so a module
#: nobody placed has no layer
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "the spine and the client pipeline",
        (
            "engine",
            "engine.errors",
            "engine.settings",
            "engine.protocol",
            "engine.cancellation",
            "engine.pipeline.*",
            "engine.machine.*",
            "engine.datafiles",
        ),
    ),
    (
        "cores and transports",
        (
            "engine.backends.*",
            "engine.pytorch.*",
            "engine.triton.*",
        ),
    ),
    (
        "the pruner and its loading",
        (
            "engine.pruner",
            "engine.measuring",
            "engine.compressor",
            "engine.batchfile",
            "engine.fidelity_check",
            "engine.models.*",
        ),
    ),
    ("remote models", ("engine.remote.*",)),
    ("the HTTP API and the MCP server", ("engine.http.*",)),
    (
        "the applications, the measuring tools and the exporter",
        (
            "engine.bench.*",
            "engine.evaluate.*",
            "engine.rag.*",
            "engine.integrations.*",
            "export.*",
            "triton_models.*",
        ),
    ),
    ("the command line", ("engine.cli.*", "engine.__main__")),
]
#: imports upward on purpose, the house's one circle: `Pruner.connect` and `Compressor.connect`, the
#: public API's doors to the remote models' one module of connecting (engine.remote.connect)
UPWARD_DOORS = {
    ("engine.pruner", "engine.remote.connect"),
    ("engine.compressor", "engine.remote.connect"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _places(entry: str, name: str) -> bool:
    """Whether LAYERS' `entry` places module `name`: it names it, or it is "package.*" and
    `name` is that package or one of its modules."""
    return name == entry or entry.endswith(".*") and (name + ".").startswith(entry[:-1])


def layer_of(name: str) -> int | None:
    """The layer of module `name`, None if no entry places it."""
    return next((k for k, (_, entries) in enumerate(LAYERS) if any(_places(e, name) for e in entries)), None)


PACKAGE = _modules("engine/**/*.py", "export/*.py", "triton_models/*/model.py")


def _graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (lazy imports included)."""
    names = {_module_name(p): p for p in PACKAGE}
    graph = {}
    for name, path in names.items():
        deps = set()
        for imported in imports(path):
            parts = imported.split(".")
            # `from a.b import c`: a.b.c if that is a module, else a.b
            for k in range(len(parts), 0, -1):
                if ".".join(parts[:k]) in names:
                    deps.add(".".join(parts[:k]))
                    break
        graph[name] = deps - {name}
    return graph


def test_every_module_has_a_layer():
    assert [n for n in _graph() if layer_of(n) is None] == []


def test_a_module_has_a_layer_only_where_an_entry_places_it():
    """A new top-level module has none until it is named; a package entry ("engine.bench.*")
    places its package and every module in it."""
    assert layer_of("engine.new_module") is None and layer_of("engine.models") is not None
    assert layer_of("engine.benchmark") is None
    assert layer_of("engine.bench") == layer_of("engine.bench.new_module") == layer_of("export.onnx")
    assert layer_of("engine.machine.timing") == layer_of("engine.errors") == 0


def test_no_module_imports_a_layer_above_its_own():
    """(A module without a layer is test_every_module_has_a_layer's to report.)"""
    graph = _graph()
    placed = {m: layer_of(m) for m in graph}
    upward = sorted(
        f"{m} ({LAYERS[placed[m]][0]}) imports {d} ({LAYERS[placed[d]][0]})"
        for m, deps in graph.items()
        for d in deps
        if None not in (placed[m], placed[d]) and placed[d] > placed[m] and (m, d) not in UPWARD_DOORS
    )
    assert upward == []


def test_the_imports_have_no_cycle():
    """No module reaches itself through its imports (the public door aside)."""
    graph = {m: {d for d in deps if (m, d) not in UPWARD_DOORS} for m, deps in _graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d) :] + [m, d]) if d in path else f"{m} -> {d}")
            elif d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_the_direction_rules_catch_an_upward_import(tmp_path, monkeypatch):
    """The rules see a spine module importing the HTTP API."""
    fake = {**_graph(), "engine.pipeline.decide": _graph()["engine.pipeline.decide"] | {"engine.http.app"}}
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: fake)
    with pytest.raises(AssertionError):
        test_no_module_imports_a_layer_above_its_own()
    fake["engine.http.app"] = fake["engine.http.app"] | {"engine.evaluate.quality"}
    fake["engine.evaluate.quality"] = fake["engine.evaluate.quality"] | {"engine.http.app"}
    with pytest.raises(AssertionError):
        test_the_imports_have_no_cycle()


def test_no_two_product_modules_share_a_name():
    """A module's name says its job across the tree (Triton's templates are model.py by Triton's rule)."""
    seen: dict[str, list[str]] = {}
    for path in _modules("engine/**/*.py", "export/*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
