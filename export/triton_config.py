"""The pieces of a Triton `config.pbtxt` that the pruners' repository (triton_repository.py) and
an LLMLingua-2 compressor's (triton_compressor.py) both write."""

from __future__ import annotations

import json
from typing import Any

from engine.backends.onnxruntime import SHRINK_ABOVE_TOKENS


def tensor(name: str, dtype: str, dims: str, reshape: str = "", optional: bool = False) -> str:
    """One entry of an `input` or `output` list."""
    extra = "\n    optional: true" if optional else ""
    return f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: [ {dims} ]{reshape}{extra}\n  }}'


def parameters(params: dict[str, str]) -> str:
    """The `parameters` entries (string values, JSON-quoted)."""
    return "\n".join(
        f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: {json.dumps(v)} }}\n}}'
        for k, v in params.items()
    )


def joins_requests(precision: str, join_requests: str) -> bool:
    """Whether the cpu core runs the requests the dynamic batcher groups as one padded batch.
    An INT8 graph quantizes its activations with scales taken over the whole batch, so a
    joined run makes each answer depend on the requests beside it: "auto" runs them alone."""
    if join_requests == "auto":
        return precision != "int8"
    return join_requests == "always"


def core_parameters(
    opts: Any,
    pad_id: int,
    manifest_json: str,
    precision: str,
    runtime: str,
    graph: str,
    text_model: str | None,
) -> dict[str, str]:
    """The core model's parameters, a pruner's and a compressor's: what the python core checks a
    request against (`pad_id`, `prune_manifest`), ONNX Runtime's threads and memory settings; on
    the cpu target the python core's runtime and graph, whether it joins requests (joins_requests)
    and OpenVINO's inference precision; the text model beside it (`prune_text_model`)."""
    params = {"pad_id": str(pad_id), "prune_manifest": manifest_json}
    if opts.target == "gpu-onnx":
        params.update(ort_backend_parameters(opts))
    else:  # the python core's own (triton_models/python_core/model.py reads them)
        params.update(
            intra_op_threads=str(opts.intra_op_threads),
            ort_arena=opts.ort_arena,
            ort_denormals=opts.ort_denormals,
            ort_shrink_above_tokens=str(SHRINK_ABOVE_TOKENS),
        )
    if opts.target == "gpu-graph":  # the python core on the GPU graph (GpuGraphBackend)
        params.update(
            runtime="gpu_graph",
            graph=graph,
            device=opts.graph_device,
            max_batch_tokens=str(opts.max_batch_tokens),
            gpu_max_batch_size=str(opts.max_batch_size),
        )
    if opts.target == "cpu":
        join = joins_requests(precision, opts.join_requests)  # INT8's requests run alone
        params.update(join_requests="true" if join else "false", runtime=runtime, graph=graph)
        if runtime == "openvino":
            params["inference_precision"] = "bf16" if opts.inference_precision == "bf16" else "f32"
    if text_model:
        params["prune_text_model"] = text_model
    return params


def ort_backend_parameters(opts: Any) -> dict[str, str]:
    """The parameters Triton's onnxruntime backend reads (triton-inference-server/onnxruntime_backend,
    src/onnxruntime.cc: an unknown key is ignored without a word, so the python core's own keys
    would do nothing there): the CUDA provider's arena grows by what a run asks for
    (`arena_extend_strategy` 1, kSameAsRequested; the backend's default doubles it), which is what
    N instances, each a session with its own weights and arena, hold the device to; runs in
    sequence; and the intra-op threads where set (`intra_op_thread_count`, for nodes left on the CPU).
    The backend has no CUDA graphs for the CUDA provider (onnxruntime_backend#168): the GPU graph's
    captured shapes are the in-process engine's and the gpu-graph target's."""
    params = {"arena_extend_strategy": "1", "execution_mode": "0"}
    if opts.intra_op_threads:
        params["intra_op_thread_count"] = str(opts.intra_op_threads)
    return params
