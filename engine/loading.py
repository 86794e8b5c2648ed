"""Opening a model for the in-process pruner: an exported folder for ONNX Runtime, or a
checkpoint for PyTorch. `Pruner.load` is the door; this module does the work and returns
the pieces a `Pruner` is made of (its core, tokenizer and spec). The Triton half of
loading, `Pruner.connect`, is `engine.triton.connect`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.backends.base import Backend
from engine.batching import BatchingConfig
from engine.encode import manifest_tokenizer
from engine.errors import InputError, ModelLoadError
from engine.spec import Manifest, ModelSpec, Runtime

BACKENDS = ("onnxruntime", "openvino", "torch")
DTYPES = ("float32", "float16", "bfloat16")
ATTENTIONS = ("eager", "sdpa")


def open_model(path: str | Path, backend: str | None = None, *, family: str | None = None,
               threads: int | None = None, providers: list[str] | None = None,
               batching: BatchingConfig | None = None, graph: str | None = None, device: str = "cpu",
               options: dict[str, Any] | None = None, tensorrt: bool | str | Path = False, log: Any = None,
               dtype: str = "float32", attn: str = "eager", precision: str | None = None,
               shape_cache: int | None = None) -> tuple[Backend, Any, ModelSpec]:
    """(core, tokenizer, spec) of an exported model folder (ONNX Runtime or OpenVINO) or a
    checkpoint (backend="torch"); the arguments are `Pruner.load`'s. With no `backend`, an
    export runs where its manifest's `runtime` says (`prune export --precision auto`'s
    pick), else on ONNX Runtime."""
    if backend is not None and backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}: onnxruntime, openvino or torch (Triton: Pruner.connect)")
    if precision not in (None, "fp32"):              # bf16: an OpenVINO inference precision
        if backend not in (None, "openvino"):
            raise InputError(f"precision {precision!r} is an OpenVINO inference precision: backend='openvino'")
        backend = "openvino"
    if str(path) == "default" and not Path("default").exists():
        from engine.default_model import default_checkpoint, ensure_default_model
        path = default_checkpoint() if backend == "torch" else ensure_default_model()
    path = Path(path)
    if backend == "torch":
        from engine.backends.torch import TorchBackend
        if dtype not in DTYPES:
            raise InputError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        if attn not in ATTENTIONS:
            raise InputError(f"attn must be eager or sdpa, got {attn!r}")
        return TorchBackend.from_checkpoint(path, family=family, options=options, attn=attn, threads=threads,
                                            device=device, dtype=dtype)
    manifest = Manifest.read(path)
    spec = manifest.spec(name=path.name)
    tokenizer = manifest_tokenizer(path, manifest, spec.family)
    graph_file = path / (graph or manifest.graph)
    if backend is None and graph is None and device == "cpu" and not tensorrt:
        backend, precision = preferred_runtime(path, manifest, log)
    backend, precision = backend or "onnxruntime", precision or "fp32"
    if backend == "openvino" or graph_file.suffix == ".xml":     # an OpenVINO IR export runs on OpenVINO
        if device != "cpu" or tensorrt:
            raise InputError("the OpenVINO backend runs on the CPU (device='cpu', no TensorRT)")
        from engine.backends.openvino import OpenVinoBackend
        core: Backend = OpenVinoBackend(graph_file, precision=precision, threads=threads, shape_cache=shape_cache)
    else:
        core = _onnxruntime(path, graph_file, spec, manifest, threads=threads, providers=providers,
                            batching=batching, device=device, tensorrt=tensorrt, log=log)
    missing = set(spec.input_names) - set(core.input_names)
    if missing:
        raise ModelLoadError(f"{path}: graph lacks inputs {sorted(missing)}")
    return core, tokenizer, spec


def preferred_runtime(path: Path, manifest: Manifest, log: Any) -> tuple[str, str]:
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
    message = (f"{path}: its export prefers {runtime} (picked by prune export --precision auto), but {why}; "
               "running ONNX Runtime fp32 on the same graph instead")
    if log is not None:
        log(message)
    else:
        import warnings
        warnings.warn(message, RuntimeWarning, stacklevel=4)
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
        from engine.cpu import BF16_MISSING
        if not bf16_supported():
            return BF16_MISSING
    return None


def _onnxruntime(path: Path, graph_file: Path, spec: ModelSpec, manifest: Manifest, *, threads, providers, batching,
                 device, tensorrt, log) -> Backend:
    from engine.backends.onnxruntime import OnnxRuntimeBackend
    trt = None
    if tensorrt:
        from engine.backends.onnxruntime import tensorrt_options
        trt = tensorrt_options(list(spec.input_names), list(manifest.buckets or [spec.max_length]),
                               (batching or BatchingConfig()).max_batch_size,
                               Path(tensorrt) if isinstance(tensorrt, (str, Path)) else path / "trt-cache")
    return OnnxRuntimeBackend(graph_file, intra_op_threads=threads, providers=providers, device=device,
                              tensorrt=trt, log=log)
