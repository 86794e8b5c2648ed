"""Exported model folder -> Triton Inference Server model repository.

    prune repository --model build/provence --out model_repository --target cpu

Targets:
- `cpu`: python backend running ONNX Runtime (the only backend the CPU server here has),
  or OpenVINO (`runtime="openvino"`, where `[openvino]` is installed; an OpenVINO IR
  export always runs there);
- `cpu-openvino`: Triton's own openvino backend in NVIDIA's container (ONNX or IR);
- `gpu-onnx`: Triton's onnxruntime backend on GPUs, optionally with the TensorRT
  execution accelerator (fp16);
- `gpu-tensorrt`: Triton's tensorrt backend with the plan from `prune export --tensorrt`;
- `gpu-graph`: the python core on a GPU running the engine's GPU graph on an fp16 export (one copy
  of the weights, CUDA graphs captured in `initialize`, so the model is ready once they are, within
  the device-memory budget); needs the engine in Triton's python environment, as the text model.

Every core model gets the engine's contract as its inputs/outputs, dynamic batching
whose preferred batch sizes follow the token budget at the client's length buckets, an
instance group, a warmup request per bucket group, and the export's manifest (the
client reads it from the model config, so client and server cannot drift).

Beside each core model `<name>` goes its text model `<name>_text` (python backend, CPU,
for every target): text in, pruned text out (`engine.triton.wire`), running the engine's own
splitting, tokenization and decisions and sending blocks to the core over BLS. The
tokenizer and the manifest are files in its version folder; clients of the core fetch
the tokenizer from it (a describe request), so no config carries the tokenizer.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from engine.models.loading import ModelKind, model_kind
from engine.errors import ExportError
from engine.pipeline.spec import RUNTIMES as MANIFEST_RUNTIMES
from engine.pipeline.spec import MANIFEST, CompressorManifest, Manifest
from export.tensorrt import TRT_GRAPH
from export.triton_config import core_parameters, parameters, tensor
from triton_models import CORE, TEXT, template
from engine.settings import DEFAULTS, checked
from engine.triton.wire import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_PASSAGES,
    DESCRIBE_OUTPUTS,
    TEXT_INPUTS,
    TEXT_OUTPUTS,
)

TARGETS = ("cpu", "cpu-openvino", "gpu-onnx", "gpu-tensorrt", "gpu-graph")
#: what the cpu target's python core model can run the graph with
RUNTIMES = tuple(MANIFEST_RUNTIMES)
TEXT_SUFFIX = "_text"
_TRITON_TYPES = {
    "BYTES": "TYPE_STRING",
    "FP32": "TYPE_FP32",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
}


@dataclass
class RepositoryOptions:
    """What `prune repository` writes: target, batching, instances, threads, the text model."""

    target: str = "cpu"
    name: str | None = None
    max_batch_size: int = DEFAULTS.max_batch_size
    max_batch_tokens: int = DEFAULTS.max_batch_tokens
    max_queue_delay_us: int = 2000
    preferred_batch_sizes: list[int] | None = None
    instances: int = 1
    intra_op_threads: int = 0
    trt_accelerator: bool = False
    version: int = 1
    text_model: bool = True
    text_instances: int = 4
    text_max_passages: int = DEFAULT_MAX_PASSAGES
    text_max_chars: int = DEFAULT_MAX_CHARS
    core_timeout_ms: int = 60_000
    overwrite: bool = False
    ort_arena: str = DEFAULTS.ort_arena  # cpu target: what ONNX Runtime's arena does after a run
    ort_denormals: str = DEFAULTS.ort_denormals  # cpu target: ONNX Runtime's denormal floats
    join_requests: str = DEFAULTS.join_requests  # cpu target: join the batcher's requests in one run
    #: cpu target: the python core's runtime (onnxruntime/openvino); None: the export's
    #: preferred runtime (its manifest's `runtime`), else onnxruntime
    runtime: str | None = None
    #: OpenVINO (cpu with runtime openvino, cpu-openvino): fp32 or bf16; None: the export's
    #: preferred precision where it prefers OpenVINO, else fp32
    inference_precision: str | None = None
    #: gpu-graph: the device it runs on; "cpu" rehearses it on the CPU provider (the tests)
    graph_device: str = "cuda"

    def __post_init__(self) -> None:
        # the runtime settings' choices are engine.settings'; checked here, where the options are made
        for name in ("ort_arena", "ort_denormals", "join_requests"):
            checked(name, getattr(self, name), ExportError)


def preferred_sizes(buckets: list[int], max_batch_tokens: int, max_batch_size: int) -> list[int]:
    """Batch sizes that fill the token budget at a few representative bucket lengths."""
    sizes = set()
    for length in (128, 256, 512):
        fitting = [b for b in buckets if b <= length]
        if fitting:
            sizes.add(max(1, min(max_batch_size, max_batch_tokens // fitting[-1])))
    return sorted(sizes)


def warmup_lengths(buckets: list[int]) -> list[int]:
    """The shortest, a middle and the longest bucket: first requests at each are slow."""
    return sorted({buckets[0], buckets[len(buckets) // 2], buckets[-1]})


def render_text_config(name: str, core: str, manifest: Manifest, opts: RepositoryOptions) -> str:
    """config.pbtxt of the text model `name` in front of the core model `core`."""
    inputs = ",\n".join(
        tensor(n, _TRITON_TYPES[t], ", ".join(map(str, d)), optional=True)
        for n, (t, d) in TEXT_INPUTS.items()
    )
    outputs = ",\n".join(
        tensor(n, _TRITON_TYPES[t], ", ".join(map(str, d)))
        for n, (t, d) in {**TEXT_OUTPUTS, **DESCRIBE_OUTPUTS}.items()
    )
    params = {
        "core_model": core,
        "core_max_batch_size": str(opts.max_batch_size),
        "max_batch_tokens": str(opts.max_batch_tokens),
        "max_passages": str(opts.text_max_passages),
        "max_chars": str(opts.text_max_chars),
        "core_timeout_ms": str(opts.core_timeout_ms),
        "prune_manifest": json.dumps(manifest.to_dict()),
    }
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"instance_group [ {{ count: {opts.text_instances} kind: KIND_CPU }} ]\n"
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n" + parameters(params) + "\n"
    )


def render_config(name: str, manifest: Manifest, opts: RepositoryOptions, text_model: str | None) -> str:
    """The core model's config.pbtxt."""
    inputs = ",\n".join(tensor(n, "TYPE_INT64", "-1") for n in manifest.inputs)
    # rerank_score is [B]: exposed as [B, 1] with the model's own shape [B] (reshape [])
    outputs = ",\n".join(
        [
            tensor("rerank_score", "TYPE_FP32", "1", "\n    reshape: { shape: [ ] }"),
            tensor("sentence_probs", "TYPE_FP32", "-1"),
        ]
    )
    if opts.target == "cpu-openvino":
        return render_openvino_config(name, manifest, opts, text_model)
    preferred = opts.preferred_batch_sizes or preferred_sizes(
        list(manifest.buckets), opts.max_batch_tokens, opts.max_batch_size
    )
    if opts.target == "cpu":
        head = 'backend: "python"'
        kind = "KIND_CPU"
    elif opts.target == "gpu-onnx":
        head = 'platform: "onnxruntime_onnx"'
        kind = "KIND_GPU"
    elif opts.target == "gpu-graph":
        head = 'backend: "python"'
        kind = "KIND_GPU" if opts.graph_device == "cuda" else "KIND_CPU"
    else:
        head = 'platform: "tensorrt_plan"'
        kind = "KIND_GPU"
    runtime = core_runtime(manifest, opts) if opts.target == "cpu" else opts.runtime
    params = core_parameters(
        opts,
        manifest.tokenizer.pad_id,
        json.dumps(manifest.to_dict()),
        manifest.precision,
        runtime,
        core_graph(manifest) if opts.target in ("cpu", "gpu-graph") else "",
        text_model,
    )
    param_text = parameters(params)
    accel = ""
    if opts.target == "gpu-onnx" and opts.trt_accelerator:
        accel = (
            "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [ {\n"
            '      name: "tensorrt"\n      parameters { key: "precision_mode" value: "FP16" }\n'
            '      parameters { key: "max_workspace_size_bytes" value: "4294967296" }\n'
            '      parameters { key: "trt_engine_cache_enable" value: "1" }\n    } ]\n  }\n}\n'
        )
    return (
        f'name: "{name}"\n{head}\nmax_batch_size: {opts.max_batch_size}\n'
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        f"  max_queue_delay_microseconds: {opts.max_queue_delay_us}\n}}\n"
        f"instance_group [ {{ count: {opts.instances} kind: {kind} }} ]\n"
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n"
        f"{accel}{_warmup(manifest, batched=True)}" + param_text + "\n"
    )


def _warmup(manifest: Manifest, batched: bool) -> str:
    """model_warmup: one request of one row at three bucket lengths (a model without
    Triton's batching, max_batch_size 0, is given the row's batch axis itself)."""
    warmups = []
    for length in warmup_lengths(list(manifest.buckets)):
        dims = f"{length}" if batched else f"1, {length}"
        parts = []
        for n in manifest.inputs:
            data = f'input_data_file: "ones_{length}"' if n == "attention_mask" else "zero_data: true"
            parts.append(
                f'    inputs {{\n      key: "{n}"\n      value: {{ data_type: TYPE_INT64 '
                f"dims: [ {dims} ] {data} }}\n    }}"
            )
        tensors = "\n".join(parts)
        warmups.append(f'  {{\n    name: "warmup_{length}"\n    batch_size: 1\n{tensors}\n  }}')
    return "model_warmup [\n" + ",\n".join(warmups) + "\n]\n"


def served_graph(folder: Path, manifest: Manifest, opts: RepositoryOptions) -> tuple[Path, str | None]:
    """The graph the core model is given, and its external data file's name (None: none): the export's
    own, or for ONNX Runtime's TensorRT accelerator its plain graph where the export has one."""
    plain = folder / TRT_GRAPH
    if opts.target == "gpu-onnx" and opts.trt_accelerator and plain.is_file():
        data = plain.with_name(TRT_GRAPH + ".data")
        return plain, data.name if data.is_file() else None
    return folder / manifest.graph, manifest.external_data or None


def tensorrt_refusal(graph: Path) -> str:
    """The ops of `graph` that TensorRT takes no part of (ONNX Runtime's com.microsoft contrib ops:
    the GPU graph's MultiHeadAttention, the optimizer's fusions), in words; "" when there are none."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    ops = sorted({n.op_type for n in model.graph.node if n.domain == "com.microsoft"})
    return ", ".join(f"com.microsoft.{op}" for op in ops)


def is_ir(manifest: Manifest) -> bool:
    """Whether the export is an OpenVINO IR (prune export --precision ov-int8)."""
    return Path(manifest.graph).suffix == ".xml"


def core_runtime(manifest: Manifest, opts: RepositoryOptions) -> str:
    """What the cpu target's python core runs the graph with: an OpenVINO IR export always
    OpenVINO, an ONNX graph what `opts.runtime` says."""
    return "openvino" if is_ir(manifest) else opts.runtime


def core_graph(manifest: Manifest) -> str:
    """The graph's file name in the core model's version folder."""
    return "model.xml" if is_ir(manifest) else "model.onnx"


def render_openvino_config(
    name: str, manifest: Manifest, opts: RepositoryOptions, text_model: str | None
) -> str:
    """The core model's config.pbtxt for Triton's openvino backend (NVIDIA's container).

    `max_batch_size: 0` with the batch axis in the dims: that backend answers a batched
    model's requests only when the batch fills max_batch_size exactly, or pads every run
    to it (ENABLE_BATCH_PADDING; its src/openvino.cc), so the client's own batches (the
    token budget, at the length buckets) go to it as they are, one run each, on
    `instances` instances of one stream each (its latency setting)."""
    inputs = ",\n".join(tensor(n, "TYPE_INT64", "-1, -1") for n in manifest.inputs)
    outputs = ",\n".join(
        [tensor("rerank_score", "TYPE_FP32", "-1"), tensor("sentence_probs", "TYPE_FP32", "-1, -1")]
    )
    params = {"NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY"}
    if opts.intra_op_threads:
        params["INFERENCE_NUM_THREADS"] = str(opts.intra_op_threads)
    if opts.inference_precision == "bf16":
        params["HINT_BF16"] = "YES"
    params.update(
        {"pad_id": str(manifest.tokenizer.pad_id), "prune_manifest": json.dumps(manifest.to_dict())}
    )
    if text_model:
        params["prune_text_model"] = text_model
    return (
        f'name: "{name}"\nbackend: "openvino"\ndefault_model_filename: "{core_graph(manifest)}"\n'
        f"max_batch_size: 0\ninput [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"instance_group [ {{ count: {opts.instances} kind: KIND_CPU }} ]\n"
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n"
        f"{_warmup(manifest, batched=False)}" + parameters(params) + "\n"
    )


def with_preferred_runtime(manifest: Manifest, opts: RepositoryOptions, log=print) -> RepositoryOptions:
    """`opts` with `runtime` and `inference_precision` decided where they are None: the
    export's preferred runtime (`prune export --precision auto`'s pick) where the target runs
    it (the cpu target's python core; cpu-openvino for OpenVINO's precision), else ONNX
    Runtime and fp32. Said in the log when the preference decided."""
    pref = manifest.runtime
    runtime = opts.runtime
    if runtime is None:
        runtime = pref.backend if pref is not None and opts.target == "cpu" else "onnxruntime"
    precision = opts.inference_precision
    if precision is None:
        on_openvino = opts.target == "cpu-openvino" or (
            opts.target == "cpu" and (runtime == "openvino" or is_ir(manifest))
        )
        precision = (
            pref.precision if pref is not None and pref.backend == "openvino" and on_openvino else "fp32"
        )
    if pref is not None and (opts.runtime is None or opts.inference_precision is None):
        log(
            f"the export prefers {pref} (prune export --precision auto): the core model runs "
            f"{'openvino' if opts.target == 'cpu-openvino' else runtime} {precision}"
        )
    return replace(opts, runtime=runtime, inference_precision=precision)


def check_gpu_target(model_folder: Path, manifest: Manifest, opts: RepositoryOptions, log) -> None:
    """ExportError where a GPU target cannot serve the export as asked: TensorRT's accelerator on
    a graph with contrib ops (it is given the export's plain graph where there is one), gpu-graph on
    anything but the fp16 GPU graph."""
    if opts.target == "gpu-onnx" and opts.trt_accelerator:
        graph, _ = served_graph(model_folder, manifest, opts)
        refused = tensorrt_refusal(graph)
        if refused:
            raise ExportError(
                f"{model_folder}: TensorRT cannot take this graph's {refused} (ONNX Runtime's contrib ops, which "
                "no TensorRT parser or plugin knows): the accelerator would split it into pieces around them on "
                "the CUDA provider, and its CUDA graphs would not capture. Export with --tensorrt, which also "
                "writes the plain graph (model.trt.onnx) that the accelerator is then given, or serve on "
                "gpu-onnx without --trt-accelerator"
            )
        if graph.name == TRT_GRAPH:
            log(
                f"note: the TensorRT accelerator is given {TRT_GRAPH}, the export's plain graph (TensorRT parses it)"
            )
    if opts.target == "gpu-graph" and not manifest.data.get("gpu_graph"):
        raise ExportError(
            f"{model_folder} is a {manifest.precision} export: gpu-graph serves the GPU graph, an fp16 export "
            "(prune export --precision fp16)"
        )
    if opts.target == "gpu-graph" and opts.instances > 1:
        log(
            f"note: gpu-graph with {opts.instances} instances holds {opts.instances} copies of the weights and "
            "of the captured shapes on the GPU (each instance is a process of its own)"
        )


def build_repository(model_folder: str | Path, out: str | Path, opts: RepositoryOptions, log=print) -> Path:
    """Write (or add to) a model repository; returns the model's folder."""
    model_folder = Path(model_folder)
    name = opts.name or model_folder.name
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ExportError(f"model name {name!r}: use letters, digits, - and _")
    text_name = name + TEXT_SUFFIX if opts.text_model else None
    if (model_folder / MANIFEST).is_file() and model_kind(
        model_folder
    ) is ModelKind.COMPRESSOR:  # an LLMLingua-2 export
        from export.triton_compressor import build_compressor_repository

        # auto's ov-bf16 pick: OpenVINO bf16 on the cpu target
        opts = with_preferred_runtime(CompressorManifest.read(model_folder), opts, log)
        return build_compressor_repository(model_folder, Path(out), name, text_name, opts, log)
    manifest = Manifest.read(model_folder)
    if opts.target not in TARGETS:
        raise ExportError(f"target must be one of {TARGETS}, got {opts.target!r}")
    opts = with_preferred_runtime(manifest, opts, log)
    if opts.max_batch_size < 1:
        raise ExportError("max_batch_size must be >= 1")
    if opts.runtime not in RUNTIMES:
        raise ExportError(f"runtime must be one of {RUNTIMES}, got {opts.runtime!r}")
    if opts.inference_precision not in MANIFEST_RUNTIMES["openvino"]:
        raise ExportError(
            f"inference_precision must be one of {MANIFEST_RUNTIMES['openvino']}, "
            f"got {opts.inference_precision!r}"
        )
    if opts.runtime != "onnxruntime" and opts.target != "cpu":
        raise ExportError(
            f"runtime {opts.runtime} is the cpu target's python core; --target cpu-openvino "
            "is Triton's own openvino backend"
        )
    openvino = opts.target == "cpu-openvino" or (
        opts.target == "cpu" and core_runtime(manifest, opts) == "openvino"
    )
    if opts.inference_precision == "bf16" and not openvino:
        raise ExportError(
            "inference_precision bf16 is OpenVINO's: use --target cpu-openvino, or --target cpu "
            "with --backend openvino"
        )
    if is_ir(manifest) and opts.target not in ("cpu", "cpu-openvino"):
        raise ExportError(
            f"{model_folder} is an OpenVINO IR ({manifest.precision}): it serves on the cpu or "
            f"cpu-openvino target, not {opts.target}"
        )
    if openvino and manifest.precision == "int8":
        log(
            "note: OpenVINO runs ONNX Runtime's dynamic INT8 graph at a fraction of its fp32 speed; for INT8 on "
            "OpenVINO export --precision ov-int8 (static scales) and serve that"
        )
    if opts.join_requests == "never" and opts.target != "cpu":
        raise ExportError(
            f"join_requests never needs the cpu target: Triton's own backends ({opts.target}) "
            "always run the requests the dynamic batcher groups as one batch"
        )
    if opts.target not in ("cpu", "cpu-openvino") and manifest.precision == "int8":
        log(
            f"note: {opts.target} joins the requests its dynamic batcher groups; with an INT8 graph an answer "
            "can move slightly with its batch company (the cpu target runs them alone)"
        )
    check_gpu_target(model_folder, manifest, opts, log)
    if opts.text_model and opts.text_instances < 1:
        raise ExportError("text_instances must be >= 1")
    if opts.text_model and (opts.text_max_passages < 1 or opts.text_max_chars < 1):
        raise ExportError("the text model's limits must be >= 1")
    # Every file this needs is found before anything is written: no half-written model.
    try:
        templates = {t: template(t) for t in (CORE, TEXT)}
    except FileNotFoundError as exc:
        raise ExportError(str(exc)) from exc
    model_dir = Path(out) / name
    existing = [d for d in (model_dir, Path(out) / (text_name or "")) if d != Path(out) and d.exists()]
    if existing and not opts.overwrite:
        raise ExportError(f"{', '.join(map(str, existing))} exists: --overwrite replaces it")
    for d in existing:
        shutil.rmtree(d)
    try:
        _write_models(model_folder, manifest, out, name, model_dir, text_name, opts, templates, log)
    except BaseException:
        # never leave a half-written model behind
        for d in (model_dir, Path(out) / (text_name or "")):
            if d != Path(out):
                shutil.rmtree(d, ignore_errors=True)
        raise
    return model_dir


def _write_models(
    model_folder: Path,
    manifest: Manifest,
    out: str | Path,
    name: str,
    model_dir: Path,
    text_name: str | None,
    opts: RepositoryOptions,
    templates: dict[str, Path],
    log,
) -> None:
    version_dir = model_dir / str(opts.version)
    version_dir.mkdir(parents=True)
    if opts.target in ("cpu", "cpu-openvino", "gpu-onnx", "gpu-graph"):
        graph = core_graph(manifest)
        source, external = served_graph(model_folder, manifest, opts)
        shutil.copy2(source, version_dir / graph)
        if graph == "model.xml":  # the IR's weights, beside it under the name OpenVINO looks for
            shutil.copy2((model_folder / manifest.graph).with_suffix(".bin"), version_dir / "model.bin")
        if external:
            shutil.copy2(model_folder / external, version_dir / external)
        if opts.target in ("cpu", "gpu-graph"):
            shutil.copy2(templates[CORE], version_dir / "model.py")
    else:
        plan = model_folder / "model.plan"
        if plan.is_file():
            shutil.copy2(plan, version_dir / "model.plan")
        else:
            log(
                f"note: {plan} does not exist yet: build it with {model_folder / 'build_tensorrt.sh'} "
                f"inside NVIDIA's TensorRT/Triton container and copy it to {version_dir / 'model.plan'}"
            )
    # Warmup data: attention_mask of ones (zeros would be an all-padding row).
    import numpy as np

    (model_dir / "warmup").mkdir(exist_ok=True)
    for length in warmup_lengths(list(manifest.buckets)):
        (model_dir / "warmup" / f"ones_{length}").write_bytes(np.ones(length, dtype=np.int64).tobytes())
    (model_dir / "config.pbtxt").write_text(render_config(name, manifest, opts, text_name))
    shutil.copy2(model_folder / "manifest.json", model_dir / "manifest.json")
    log(f"wrote {model_dir} (target {opts.target}, max_batch_size {opts.max_batch_size})")
    if text_name:
        write_text_model(model_folder, manifest, Path(out) / text_name, name, opts, templates[TEXT])
        log(
            f"wrote {Path(out) / text_name} (text in, pruned text out; {opts.text_instances} CPU instances "
            f"in front of {name})"
        )


def write_text_model(
    model_folder: Path, manifest: Manifest, text_dir: Path, core: str, opts: RepositoryOptions, model_py: Path
) -> Path:
    """`<core>_text`: config, model.py, and the export's tokenizer and manifest as files."""
    version_dir = text_dir / str(opts.version)
    version_dir.mkdir(parents=True)
    shutil.copy2(model_py, version_dir / "model.py")
    shutil.copy2(model_folder / manifest.tokenizer.file, version_dir / manifest.tokenizer.file)
    shutil.copy2(model_folder / "manifest.json", version_dir / "manifest.json")
    (text_dir / "config.pbtxt").write_text(render_text_config(text_dir.name, core, manifest, opts))
    return text_dir
