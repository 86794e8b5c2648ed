"""Opening a model in this process, the one loader of both model kinds: a folder's kind from its
manifest (a pruner's export, or an LLMLingua-2 compressor's: kind compressor) or, for a
checkpoint, its config (`model_kind`); its backend by one rule (`runtime_for`); its core made as
the options say (`LoadOptions`, the same for both kinds), on a GPU on the process's one GPU
thread. `Pruner.load` and `Compressor.load` are the doors; this module does the work and returns
the pieces they are made of (`Opened`: the core, the tokenizer, a pruner's spec). The remote half
of loading, `Pruner.connect` and `Compressor.connect`, is `engine.remote.connect`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from engine.backends.base import Backend, TokenCore
from engine.errors import InputError, ModelLoadError
from engine.pipeline.encode import BatchingConfig
from engine.pipeline.lingua_words import is_lingua_checkpoint
from engine.pipeline.spec import (
    MANIFEST,
    CompressorManifest,
    Manifest,
    ModelSpec,
    Runtime,
    manifest_tokenizer,
)
from engine.settings import DEFAULTS, TORCH_ATTENTIONS, TORCH_DTYPES, checked, setting

BACKENDS = ("onnxruntime", "openvino", "torch")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class LoadOptions:
    """How a model is opened: the one definition of `Pruner.load`'s and `Compressor.load`'s
    options, checked when made (InputError). The settings that have a `PRUNE_*` variable
    (threads, arena, the batcher's budget) are read from the environment once, by `from_env`,
    where a process starts (the CLI, the API, a door without options), and passed down from
    there. The torch fields and `batching` are a pruner's; `merge_calls` merges where a core
    merges (a pruner's in-process core, the GPU graph of either kind)."""

    backend: str | None = None  # onnxruntime, openvino, torch; None: the export's runtime, else onnxruntime
    precision: str | None = None  # OpenVINO's inference precision, fp32 or bf16 (bf16 needs backend openvino)
    threads: int | None = None  # intra-op threads (ONNX Runtime, OpenVINO, torch); None: every core
    device: str = "cpu"  # cpu, or cuda (ONNX Runtime's CUDA provider; torch: any of its devices)
    providers: tuple[Any, ...] | None = None  # ONNX Runtime's providers, as it takes them (device cpu)
    tensorrt: bool = False  # ONNX Runtime's TensorRT provider first (device cuda; fp16)
    tensorrt_cache: Path | None = None  # where its engines are kept; None: the model folder's trt-cache/
    arena: str = DEFAULTS.ort_arena  # ONNX Runtime's CPU arena after a large batch (settings: ort_arena)
    denormals: str = DEFAULTS.ort_denormals  # ONNX Runtime's denormal floats (settings: ort_denormals)
    graph: str | None = None  # another graph of the folder than its manifest's
    shape_cache: int | None = None  # OpenVINO: compiled shapes kept (0: none)
    family: str | None = None  # torch: the checkpoint's family when it cannot be told
    module_options: Mapping[str, Any] | None = (
        None  # torch: the family module's options (embedding: mode, ...)
    )
    dtype: str = "float32"  # torch: float32, float16, bfloat16
    attn: str = "eager"  # torch: eager or sdpa
    batching: BatchingConfig = field(default_factory=BatchingConfig)  # how blocks become batches
    merge_calls: str = DEFAULTS.merge_calls  # concurrent calls' batches merged: on, off, auto (on a GPU)

    def __post_init__(self) -> None:
        # a bad argument is an InputError, a setting the runtime cannot take a ModelLoadError (as the backends say)
        for name, allowed, error in (
            ("backend", BACKENDS, InputError),
            ("dtype", TORCH_DTYPES, InputError),
            ("attn", TORCH_ATTENTIONS, InputError),
            ("precision", PRECISIONS, ModelLoadError),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise error(
                    f"unknown backend {value!r}: onnxruntime, openvino or torch (Triton: Pruner.connect)"
                    if name == "backend"
                    else f"{name} must be one of {', '.join(allowed)}, got {value!r}"
                )
        checked("ort_arena", self.arena, ModelLoadError, "arena")
        checked("ort_denormals", self.denormals, ModelLoadError, "denormals")
        checked("merge_calls", self.merge_calls, InputError)
        if self.precision == "bf16" and self.backend not in (None, "openvino"):
            raise InputError("precision 'bf16' is an OpenVINO inference precision: backend='openvino'")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0
        ):
            raise ModelLoadError(f"threads must be at least 1 (None or 0: every core), got {self.threads!r}")
        if self.threads == 0:
            object.__setattr__(self, "threads", None)
        if self.tensorrt and self.device != "cuda":
            raise ModelLoadError("ONNX Runtime's TensorRT provider needs device='cuda' (--device cuda)")

    @property
    def merges(self) -> bool:
        """Whether concurrent calls' batches are merged: merge_calls on, or auto on a GPU."""
        return self.merge_calls == "on" or (self.merge_calls == "auto" and self.device == "cuda")

    @property
    def named_backend(self) -> str | None:
        """The backend these options name: `backend`, or openvino for a bf16 precision."""
        return "openvino" if self.precision == "bf16" else self.backend

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> LoadOptions:
        """The options `given` (None: not given) over the `PRUNE_*` variables in force
        (PRUNE_INTRA_OP_THREADS, PRUNE_ORT_ARENA, PRUNE_ORT_DENORMALS, PRUNE_MAX_BATCH_TOKENS,
        PRUNE_MAX_BATCH_SIZE) and the defaults. `tensorrt` may be a folder: the provider
        on, its engines kept there. An unknown name is an InputError."""
        unknown = sorted(set(given) - {f.name for f in fields(cls)})
        if unknown:
            raise InputError(
                f"unknown load option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
                f" the options are {', '.join(f.name for f in fields(cls))}"
            )
        given = {k: v for k, v in given.items() if v is not None}
        env = None if environ is None else dict(environ)
        if isinstance(given.get("tensorrt"), (str, Path)):
            given["tensorrt_cache"], given["tensorrt"] = Path(given["tensorrt"]), True
        if given.get("providers") is not None:
            given["providers"] = tuple(given["providers"])
        given.setdefault("threads", setting("threads", env))
        given.setdefault("arena", setting("ort_arena", env))
        given.setdefault("denormals", setting("ort_denormals", env))
        given.setdefault("merge_calls", setting("merge_calls", env))
        given.setdefault(
            "batching",
            BatchingConfig(
                max_batch_tokens=setting("max_batch_tokens", env),
                max_batch_size=setting("max_batch_size", env),
            ),
        )
        return cls(**given)

    @classmethod
    def given(cls, backend: Any = None, options: Any = None, **shortcuts: Any) -> LoadOptions:
        """A door's options (`Pruner.load`'s, `Compressor.load`'s): `options` (a LoadOptions, also
        taken as the door's second argument, `backend`), with the `shortcuts` (its field names:
        `threads=2`, `device="cuda"`, `tensorrt=True` or a cache folder) over them or, without
        options, over the `PRUNE_*` variables in force (`from_env`)."""
        if isinstance(backend, LoadOptions):  # Pruner.load(path, options)
            backend, options = None, backend
        if options is not None and not isinstance(options, LoadOptions):
            raise InputError(
                f"options must be a LoadOptions, got {type(options).__name__} (the family module's "
                "options are module_options=)"
            )
        if backend is not None:
            shortcuts["backend"] = backend
        if options is None:
            return cls.from_env(**shortcuts)
        if shortcuts:  # over the options given, the environment aside
            return cls.from_env({}, **{**vars(options), **shortcuts})
        return options


class ModelKind(Enum):
    """What a model folder holds: a pruner's model or an LLMLingua-2 compressor's."""

    PRUNER = "pruner"
    COMPRESSOR = "compressor"


def model_kind(path: str | Path) -> ModelKind:
    """The kind of the model at `path`: COMPRESSOR for an LLMLingua-2 export (a manifest of kind
    compressor, read whole) or checkpoint (its config.json says so), PRUNER for anything else
    (what Pruner.load then opens, or refuses saying why). No error."""
    folder = Path(path)
    if (folder / MANIFEST).is_file():
        try:
            CompressorManifest.read(folder)
        except ModelLoadError:
            return ModelKind.PRUNER
        return ModelKind.COMPRESSOR
    return ModelKind.COMPRESSOR if is_lingua_checkpoint(folder) else ModelKind.PRUNER


class Opened(NamedTuple):
    """A model opened: its core (a pruner's Backend, a compressor's TokenCore), its tokenizer, and
    a pruner's spec (None for a compressor)."""

    core: Backend | TokenCore
    tokenizer: Any
    spec: ModelSpec | None


def open_model(
    path: str | Path, options: LoadOptions, log: Any = None, kind: ModelKind | None = None
) -> Opened:
    """The model at `path` opened as `options` say, as `kind` (a door's; None: the folder's own,
    `model_kind`): a pruner's export (ONNX Runtime or OpenVINO) or checkpoint (backend torch;
    "default": the default model), or a compressor's export or checkpoint (PyTorch, its one
    backend for a checkpoint). A folder of the other kind is refused, naming its door. `log` hears
    what was chosen instead of what was asked."""
    kind = kind or model_kind(path)
    if kind is ModelKind.COMPRESSOR:
        return open_compressor(Path(path), options, log)
    return open_pruner(path, options, log)


def runtime_for(path: Path, manifest: Any, o: LoadOptions, log: Any) -> tuple[str, str | None]:
    """The one rule that picks an export's backend, for both kinds: (backend, precision) as the
    options name them (`backend`; a bf16 `precision` is OpenVINO's); else, for the manifest's own
    graph on the CPU without TensorRT, the runtime the manifest prefers where this machine has it
    (`preferred_runtime`: `prune export --precision auto`'s pick); else ONNX Runtime."""
    backend, precision = o.named_backend, o.precision
    if backend is None and o.graph is None and o.device == "cpu" and not o.tensorrt:
        backend, precision = preferred_runtime(path, manifest, log)
    return backend or "onnxruntime", precision


def open_pruner(path: str | Path, o: LoadOptions, log: Any = None) -> Opened:
    """A pruner's (core, tokenizer, spec): an exported folder (ONNX Runtime or OpenVINO, by
    `runtime_for`) or a checkpoint (backend torch); "default": the default model."""
    if str(path) == "default" and not Path("default").exists():
        from engine.models.default_model import default_model

        path = default_model(o.named_backend, o.device)
    path = Path(path)
    if o.named_backend == "torch":
        from engine.backends.torch import TorchBackend

        return Opened(
            *TorchBackend.from_checkpoint(
                path,
                family=o.family,
                options=dict(o.module_options or {}),
                attn=o.attn,
                threads=o.threads,
                device=o.device,
                dtype=o.dtype,
            )
        )
    manifest = Manifest.read(path)
    spec = manifest.spec(name=path.name)
    tokenizer = manifest_tokenizer(path, manifest, spec.family)
    graph_file = path / (o.graph or manifest.graph)
    backend, precision = runtime_for(path, manifest, o, log)
    if backend == "openvino" or graph_file.suffix == ".xml":  # an IR export runs on OpenVINO
        if o.device != "cpu" or o.tensorrt:
            raise InputError("the OpenVINO backend runs on the CPU (device='cpu', no TensorRT)")
        from engine.backends.openvino import OpenVinoBackend

        core: Backend = OpenVinoBackend(
            graph_file, precision=precision or "fp32", threads=o.threads, shape_cache=o.shape_cache
        )
    else:
        core = _onnxruntime(path, graph_file, spec, manifest, o, log)
    missing = set(spec.input_names) - set(core.input_names)
    if missing:
        raise ModelLoadError(f"{path}: graph lacks inputs {sorted(missing)}")
    if o.merges and o.device == "cpu":  # on a GPU, every core runs on the GPU thread, merging there
        from engine.backends.merging import MergingBackend

        core = MergingBackend(core, o.batching)
    return Opened(core, tokenizer, spec)


def open_compressor(folder: Path, o: LoadOptions, log: Any = None) -> Opened:
    """A compressor's (core, tokenizer): an LLMLingua-2 export on the backend `runtime_for` picks
    (ONNX Runtime, OpenVINO; an fp16 export on device cuda: the GPU graph), or a checkpoint on
    PyTorch, the CPU (a checkpoint's one backend here)."""
    from engine.pipeline.lingua_words import LinguaTokenizer, check_folder

    if not (folder / MANIFEST).is_file():
        if o.device != "cpu":
            raise ModelLoadError(
                f"device {o.device!r} runs an export: prune export --model {folder} --precision fp16 (or fp32), "
                "then load the export"
            )
        from engine.backends.torch import TorchTokenProbs

        check_folder(folder)
        tokenizer = LinguaTokenizer.from_folder(folder)
        return Opened(TorchTokenProbs.load(folder, tokenizer.size, threads=o.threads), tokenizer, None)
    manifest = CompressorManifest.read(folder)
    tokenizer = LinguaTokenizer.from_folder(folder)
    if tokenizer.size != manifest.embedding_rows:
        raise ModelLoadError(
            f"{folder}: the graph has {manifest.embedding_rows} embedding rows, the tokenizer with "
            f"llmlingua's added tokens {tokenizer.size}: the export and its tokenizer do not belong together"
        )
    graph = folder / (o.graph or manifest.graph)
    backend, precision = runtime_for(folder, manifest, o, log)
    if backend == "torch":
        raise InputError(f"{folder} is an export: backend torch runs the checkpoint it was made from")
    if backend == "openvino":
        if o.device != "cpu" or o.tensorrt:
            raise InputError("the OpenVINO backend runs on the CPU (device='cpu', no TensorRT)")
        from engine.backends.openvino import OvTokenProbs

        core: TokenCore = OvTokenProbs(
            graph, precision=precision or "fp32", threads=o.threads, shape_cache=o.shape_cache
        )
    elif o.device == "cuda" and manifest.precision == "fp16" and not o.tensorrt and o.graph is None:
        from engine.backends.gpu_token_probs import GpuTokenProbs  # one copy of the weights, CUDA graphs

        core = GpuTokenProbs(graph, log=log, merge=o.merges, **gpu_graph_settings())
    else:
        core = _ort_token_probs(folder, graph, o)
    return Opened(core, tokenizer, None)


def _ort_token_probs(folder: Path, graph: Path, o: LoadOptions) -> TokenCore:
    """A compressor's core on ONNX Runtime; on a GPU, made and run on the process's GPU thread."""
    from engine.backends.onnxruntime import OrtTokenProbs, tensorrt_options

    trt = None
    if o.tensorrt:
        from engine.backends.gpu_token_probs import LINGUA_LENGTHS, LINGUA_ROWS

        trt = tensorrt_options(
            ["input_ids", "attention_mask"],
            list(LINGUA_LENGTHS),
            LINGUA_ROWS,
            o.tensorrt_cache or folder / "trt-cache",
        )

    def make() -> TokenCore:
        return OrtTokenProbs(
            graph,
            intra_op_threads=o.threads,
            providers=None if o.providers is None else list(o.providers),
            arena=o.arena,
            denormals=o.denormals,
            device=o.device,
            tensorrt=trt,
        )

    if o.device != "cuda":
        return make()
    from engine.backends.gpu_token_probs import OnGpuThread  # every CUDA model on the one GPU thread

    return OnGpuThread(make)


def preferred_runtime(path: Path, manifest: Manifest | CompressorManifest, log: Any) -> tuple[str, str]:
    """(backend, precision) for an export loaded without a backend or precision named: its
    manifest's `runtime` where this machine can run it; else ONNX Runtime, saying why (to
    `log`, else as a warning): the same graph, so the same results within fp32's
    tolerance, only slower."""
    runtime = manifest.runtime
    if runtime is None:
        return "onnxruntime", "fp32"
    why = runtime_missing(runtime)
    if why is None:
        return runtime.backend, runtime.precision
    message = (
        f"{path}: its export prefers {runtime} (picked by prune export --precision auto), but {why}; "
        "running ONNX Runtime fp32 on the same graph instead"
    )
    if log is not None:
        log(message)
    else:
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=6)  # the door's caller
    return "onnxruntime", "fp32"


def runtime_missing(runtime: Runtime) -> str | None:
    """Why this machine cannot run `runtime`, or None when it can."""
    if runtime.backend != "openvino":
        return None
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "OpenVINO is not installed (pip install 'prune-engine[openvino]')"
    if runtime.precision == "bf16":
        from engine.backends.openvino import bf16_supported
        from engine.machine.cpu import BF16_MISSING

        if not bf16_supported():
            return BF16_MISSING
    return None


def gpu_graph_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The GPU graph's settings in force (PRUNE_GPU_GRAPHS, PRUNE_GPU_WARM, PRUNE_GPU_MEMORY), as
    GpuGraphBackend's keywords; whether it merges is each caller's (LoadOptions.merges)."""
    env = None if environ is None else dict(environ)
    return {
        "max_graphs": setting("gpu_graphs", env),
        "warm": setting("gpu_warm", env),
        "memory_limit": setting("gpu_memory", env),
    }


def _onnxruntime(
    path: Path, graph_file: Path, spec: ModelSpec, manifest: Manifest, o: LoadOptions, log: Any
) -> Backend:
    from engine.backends.onnxruntime import OnnxRuntimeBackend

    if o.device == "cuda" and not o.tensorrt and o.graph is None and manifest.data.get("gpu_graph"):
        from engine.backends.gpu_graph import GpuGraphBackend  # the fp16 export: shared weights, CUDA graphs

        return GpuGraphBackend(
            graph_file,
            list(manifest.buckets or [spec.max_length]),
            device="cuda",
            batching=o.batching,
            log=log,
            merge=o.merges,
            **gpu_graph_settings(),
        )
    trt = None
    if o.tensorrt:
        from engine.backends.onnxruntime import tensorrt_options

        trt = tensorrt_options(
            list(spec.input_names),
            list(manifest.buckets or [spec.max_length]),
            o.batching.max_batch_size,
            o.tensorrt_cache or path / "trt-cache",
        )

    def make() -> Backend:
        return OnnxRuntimeBackend(
            graph_file,
            intra_op_threads=o.threads,
            providers=None if o.providers is None else list(o.providers),
            arena=o.arena,
            device=o.device,
            tensorrt=trt,
            log=log,
            denormals=o.denormals,
        )

    if o.device != "cuda":
        return make()
    # on a GPU, made and run on the process's GPU thread (a GPU graph's capture beside it would fail
    # on this session's copies from another thread), its concurrent calls merged there where asked
    from engine.backends.gpu_shared import GpuThread
    from engine.backends.merging import MergingBackend

    gpu = GpuThread.shared()
    try:
        core = gpu.call(make)
    except BaseException:
        gpu.release()
        raise
    return MergingBackend(core, o.batching, thread=gpu, merge=o.merges)
