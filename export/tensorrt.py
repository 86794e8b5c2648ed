"""TensorRT plans from the exported ONNX graph.

TensorRT cannot be installed on the project's own machines, so this module is split:
the pure parts (optimization profiles from the client's length buckets and
`max_batch_size`, the `trtexec` command, the graph fixes TensorRT needs) are tested
everywhere; building and checking an engine runs where TensorRT exists (NVIDIA's
TensorRT or Triton containers) and raises a clear error elsewhere.

Inside a container:

    prune export --model CHECKPOINT --out build/p-trt --precision fp16 --tensorrt
    # or, with trtexec, the command written to build/p-trt/build_tensorrt.sh
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ExportError

#: the export's plain fp32 graph for TensorRT (prune export --tensorrt writes it)
TRT_GRAPH = "model.trt.onnx"

Shape = tuple[int, int]
Profile = dict[str, tuple[Shape, Shape, Shape]]

# Length groups that get their own optimization profile: kernels are tuned at each
# profile's opt shape, so short and long batches both run on kernels chosen for them.
DEFAULT_GROUPS = (128, 256, 512)


def profiles(
    input_names: Sequence[str],
    buckets: Sequence[int],
    max_batch_size: int,
    groups: Sequence[int] = DEFAULT_GROUPS,
    opt_batch: int | None = None,
) -> list[Profile]:
    """One profile per length group: min (1, shortest bucket of the group), opt (opt_batch,
    longest bucket of the group), max (max_batch_size, longest bucket of the group)."""
    if max_batch_size < 1 or not buckets:
        raise ValueError("need max_batch_size >= 1 and at least one bucket")
    buckets = sorted(buckets)
    opt_batch = min(opt_batch or max(1, max_batch_size // 2), max_batch_size)
    out: list[Profile] = []
    lower = 0
    for limit in sorted(set(list(groups) + [buckets[-1]])):
        members = [b for b in buckets if lower < b <= limit]
        lower = max(lower, limit)
        if not members:
            continue
        lo, hi = members[0], members[-1]
        out.append({n: ((1, lo), (opt_batch, hi), (max_batch_size, hi)) for n in input_names})
    return out


def _shape_arg(profile: Profile, which: int) -> str:
    return ",".join(f"{name}:{s[which][0]}x{s[which][1]}" for name, s in profile.items())


def trtexec_command(
    onnx_path: str | Path,
    plan_path: str | Path,
    profile: Profile,
    precision: str = "fp16",
    workspace_mib: int = 8192,
) -> list[str]:
    """A trtexec command line building one plan for `profile` (trtexec takes one profile;
    the Python builder below takes several)."""
    cmd = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={plan_path}",
        f"--minShapes={_shape_arg(profile, 0)}",
        f"--optShapes={_shape_arg(profile, 1)}",
        f"--maxShapes={_shape_arg(profile, 2)}",
        f"--memPoolSize=workspace:{workspace_mib}M",
    ]
    if precision in ("fp16", "int8", "fp8"):
        cmd.append("--fp16")
    if precision == "int8":
        cmd.append("--int8")
    if precision == "fp8":
        cmd.append("--fp8")
    if precision not in ("fp32", "fp16", "int8", "fp8"):
        raise ValueError(f"unknown TensorRT precision {precision!r}")
    return cmd


def write_build_script(
    folder: Path, input_names: Sequence[str], buckets: Sequence[int], max_batch_size: int, precision: str
) -> Path:
    """A trtexec script that builds the plan in `folder`, where TensorRT is."""
    whole = profiles(input_names, buckets, max_batch_size, groups=(max(buckets),))[0]
    cmd = trtexec_command(TRT_GRAPH, "model.plan", whole, precision)
    script = folder / "build_tensorrt.sh"
    script.write_text(
        "#!/usr/bin/env bash\n# Build the TensorRT plan inside NVIDIA's TensorRT or Triton container.\n"
        'set -euo pipefail\ncd "$(dirname "$0")"\n' + " ".join(shlex.quote(c) for c in cmd) + "\n"
    )
    script.chmod(0o755)
    return script


# --------------------------------------------------------------------------- build / check


def tensorrt_available() -> bool:
    """Whether TensorRT's Python package imports here."""
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return False
    return True


def _require_tensorrt():
    try:
        import tensorrt as trt
    except Exception as exc:
        raise ExportError(
            "TensorRT is not installed in this Python environment (PyPI's `tensorrt` downloads its "
            "libraries from NVIDIA's index at install time): build the plan with the export folder's "
            "build_tensorrt.sh where TensorRT is, e.g. NVIDIA's TensorRT or Triton container"
        ) from exc
    return trt


def build_engine(
    onnx_path: Path,
    plan_path: Path,
    profile_list: list[Profile],
    precision: str = "fp16",
    workspace_bytes: int = 8 << 30,
) -> Path:
    """Build and serialize a plan with the TensorRT Python API (several profiles)."""
    trt = _require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision in ("fp16", "int8", "fp8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    if precision == "fp8":
        config.set_flag(trt.BuilderFlag.FP8)
    for prof in profile_list:
        p = builder.create_optimization_profile()
        for name, (mn, op, mx) in prof.items():
            p.set_shape(name, mn, op, mx)
        config.add_optimization_profile(p)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ExportError("TensorRT failed to build the engine (see its log above)")
    plan_path.write_bytes(bytes(plan))
    return plan_path


def run_engine(plan_path: Path, feeds: list[dict[str, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run a plan on host arrays (TensorRT + torch CUDA for the buffers)."""
    trt = _require_tensorrt()
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    context = engine.create_execution_context()
    stream = torch.cuda.current_stream()
    out = []
    for feed in feeds:
        bufs: dict[str, Any] = {}
        for name, arr in feed.items():
            bufs[name] = torch.from_numpy(arr).cuda()
            context.set_input_shape(name, tuple(arr.shape))
            context.set_tensor_address(name, bufs[name].data_ptr())
        for name in ("rerank_score", "sentence_probs"):
            shape = tuple(context.get_tensor_shape(name))
            bufs[name] = torch.empty(shape, dtype=torch.float32, device="cuda")
            context.set_tensor_address(name, bufs[name].data_ptr())
        context.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        out.append((bufs["rerank_score"].cpu().numpy(), bufs["sentence_probs"].cpu().numpy()))
    return out


def check_engine(
    plan_path: Path, onnx_path: Path, feeds: list[dict[str, np.ndarray]], tolerance: float
) -> dict[str, float]:
    """The engine against ONNX Runtime on the same inputs (as `polygraphy run --trt --onnxrt`)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for feed, (r, p) in zip(feeds, run_engine(plan_path, feeds)):
        r_ref, p_ref = sess.run(["rerank_score", "sentence_probs"], feed)
        worst = max(worst, float(np.abs(p - p_ref).max(initial=0)), float(np.abs(r - r_ref).max(initial=0)))
    if worst > tolerance:
        raise ExportError(
            f"the TensorRT engine disagrees with ONNX Runtime: max |diff| {worst:.3g} > {tolerance}"
        )
    return {"max_abs_diff_vs_onnxruntime": worst, "tolerance": tolerance}


def export_tensorrt(
    folder: Path, precision: str = "fp16", max_batch_size: int = 64, log=print
) -> dict[str, Any]:
    """Add a TensorRT plan to an exported folder: fixed graph, build script, and (where
    TensorRT exists) the plan, checked against ONNX Runtime. Updates the manifest."""
    from engine.pipeline.encode import Encoder
    from engine.pipeline.spec import Manifest, manifest_tokenizer
    from export.samples import sample_batches

    if precision not in ("fp32", "fp16"):
        raise ExportError(
            "TensorRT INT8/FP8 need a graph with calibrated Q/DQ nodes (e.g. from NVIDIA "
            "ModelOpt), which this exporter does not make: use --precision fp16 with "
            "--tensorrt; the trtexec command in export.tensorrt takes --int8/--fp8 for such graphs"
        )
    manifest = Manifest.read(folder)
    trt_graph = folder / TRT_GRAPH
    if not trt_graph.is_file():
        raise ExportError(
            f"{trt_graph} is missing: export with --tensorrt (TensorRT needs the plain "
            "fp32 graph, without ONNX Runtime's fused contrib ops)"
        )
    changed = manifest.data.get("tensorrt_graph_fixes", {})
    names = list(manifest.inputs)
    script = write_build_script(folder, names, list(manifest.buckets), max_batch_size, precision)
    profile_list = profiles(names, list(manifest.buckets), max_batch_size)
    built = {
        "onnx": TRT_GRAPH,
        "graph_fixes": changed,
        "precision": precision,
        "max_batch_size": max_batch_size,
        "build_script": script.name,
        "profiles": [{n: [list(s) for s in shapes] for n, shapes in p.items()} for p in profile_list],
        "plan": None,
    }
    manifest.with_changes(tensorrt=built).write(folder)
    log(f"TensorRT input graph {trt_graph.name} (fixes: {changed}); trtexec script {script}")
    if not tensorrt_available():
        # the export is complete without the plan: a note, not a failure (`set -e` scripts go on)
        log(
            f"note: TensorRT is not installed in this Python environment, so no plan was built here; run "
            f"`sh {script.name}` in {folder} where TensorRT is (NVIDIA's TensorRT or Triton container) "
            "to build model.plan"
        )
        return built
    plan = build_engine(folder / TRT_GRAPH, folder / "model.plan", profile_list, precision)
    spec = manifest.spec(name=folder.name)
    encoder = Encoder(manifest_tokenizer(folder, manifest, spec.family), spec)
    report = check_engine(plan, trt_graph, sample_batches(encoder), tolerance=0.02)
    built.update(plan=plan.name, check=report)
    manifest.with_changes(tensorrt=built).write(folder)
    log(f"built {plan}: max |diff| vs ONNX Runtime {report['max_abs_diff_vs_onnxruntime']:.2e}")
    return built
