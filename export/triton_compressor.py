"""An LLMLingua-2 export (prune export on a compressor checkpoint) -> a Triton model repository.

    prune repository --model build/lingua --out model_repository --target cpu

Two models, as for a pruner (export/triton_repository.py):
- the core `<name>`: input_ids and attention_mask (int64 [b, L]) in, `token_probs` (float32
  [b, L]: each token's probability of label 1, keep) out, with dynamic batching. On the `cpu`
  target the python backend runs it with ONNX Runtime, or OpenVINO where the export prefers it
  (`--precision auto`'s ov-bf16 pick) or `--backend openvino` asks (the pruners' core model.py:
  each request gets its own rows back, cut to its own L); on `gpu-onnx`, Triton's onnxruntime
  backend;
- the text model `<name>_text` (python backend, CPU): a JSON call in (POST /v1/compress's
  fields), llmlingua's result out (triton_models/python_compress/model.py), its chunks sent to
  the core over BLS. `Compressor.connect` (engine/remote/compress_client.py) calls it.

The OpenVINO and TensorRT targets are the pruners' only: refused with what to use instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.errors import ExportError
from engine.pipeline.lingua_words import LinguaTokenizer
from engine.pipeline.spec import CompressorManifest
from export.triton_config import core_parameters, parameters, tensor
from triton_models import COMPRESS, CORE, template

#: the targets a compressor serves on
TARGETS = ("cpu", "gpu-onnx")
#: the model's window: llmlingua cuts chunks at 512 tokens with CLS and SEP
MAX_LENGTH = 512


def check_options(manifest: CompressorManifest, opts) -> None:
    """ExportError for what a compressor does not serve on (opts: RepositoryOptions)."""
    if opts.target not in TARGETS:
        raise ExportError(
            f"an LLMLingua-2 compressor serves on the targets {', '.join(TARGETS)}, not {opts.target!r} "
            "(OpenVINO and TensorRT are the pruners' targets)"
        )
    if opts.runtime not in ("onnxruntime", "openvino"):
        raise ExportError(
            f"an LLMLingua-2 compressor's core runs onnxruntime or openvino, not {opts.runtime!r}"
        )
    if opts.runtime == "openvino" and opts.target != "cpu":
        raise ExportError("runtime openvino is the cpu target's python core")
    if opts.inference_precision not in ("fp32", "bf16"):
        raise ExportError(f"inference_precision must be fp32 or bf16, not {opts.inference_precision!r}")
    if opts.inference_precision == "bf16" and opts.runtime != "openvino":
        raise ExportError("inference_precision bf16 is OpenVINO's: --target cpu with --backend openvino")
    if opts.max_batch_size < 1:
        raise ExportError("max_batch_size must be >= 1")
    if opts.text_model and (opts.text_instances < 1 or opts.text_max_passages < 1 or opts.text_max_chars < 1):
        raise ExportError("the text model's instances and limits must be >= 1")
    if opts.trt_accelerator:
        raise ExportError("--trt-accelerator is the pruners' (fp16 TensorRT): not measured for LLMLingua-2")


def render_core_config(
    name: str, manifest: CompressorManifest, opts, pad_id: int, text_model: str | None
) -> str:
    """The core model's config.pbtxt."""
    inputs = ",\n".join(tensor(n, "TYPE_INT64", "-1") for n in ("input_ids", "attention_mask"))
    outputs = tensor("token_probs", "TYPE_FP32", "-1")
    gpu = opts.target == "gpu-onnx"
    # what the python core checks a request against: the window and the vocabulary's rows
    manifest_json = json.dumps({**manifest.data, "max_length": MAX_LENGTH})
    params = core_parameters(
        opts, pad_id, manifest_json, manifest.precision, opts.runtime, "model.onnx", text_model
    )
    return (
        f'name: "{name}"\n'
        + ('platform: "onnxruntime_onnx"\n' if gpu else 'backend: "python"\n')
        + f"max_batch_size: {opts.max_batch_size}\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"dynamic_batching {{\n  max_queue_delay_microseconds: {opts.max_queue_delay_us}\n}}\n"
        f"instance_group [ {{ count: {opts.instances} kind: {'KIND_GPU' if gpu else 'KIND_CPU'} }} ]\n"
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n" + parameters(params) + "\n"
    )


def render_text_config(name: str, core: str, opts, tokenizer_kind: str = "unknown") -> str:
    """The text model's config.pbtxt: one JSON call in, its JSON result out."""
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f"input [\n{tensor('request', 'TYPE_STRING', '1')}\n]\n"
        f"output [\n{tensor('result', 'TYPE_STRING', '1')}\n]\n"
        f"instance_group [ {{ count: {opts.text_instances} kind: KIND_CPU }} ]\n"
        f"version_policy: {{ latest: {{ num_versions: 1 }} }}\n"
        + parameters(
            {
                "core_model": core,
                "max_passages": str(opts.text_max_passages),
                "max_chars": str(opts.text_max_chars),
                "core_timeout_ms": str(opts.core_timeout_ms),
                "prune_compressor": "true",
                # chunks per request to the core: one at a time to a CPU core (no padding), 16 to a GPU
                "batch_chunks": "16" if opts.target == "gpu-onnx" else "1",
                "tokenizer_kind": tokenizer_kind,
            }
        )
        + "\n"
    )


def build_compressor_repository(
    model_folder: Path, out: Path, name: str, text_name: str | None, opts, log
) -> Path:
    """The core model `name` and (text_name) its text model in `out`; nothing left half-written.
    `opts`: runtime and inference_precision decided (build_repository: the export's preference)."""
    manifest = CompressorManifest.read(model_folder)
    check_options(manifest, opts)
    tokenizer = LinguaTokenizer.from_folder(model_folder)
    tok = tokenizer.tok
    pad_id = next((i for t in ("[PAD]", "<pad>") if (i := tok.token_to_id(t)) is not None), 0)
    try:
        templates = {t: template(t) for t in (CORE, COMPRESS)}
    except FileNotFoundError as exc:
        raise ExportError(str(exc)) from exc
    dirs = [out / name] + ([out / text_name] if text_name else [])
    existing = [d for d in dirs if d.exists()]
    if existing and not opts.overwrite:
        raise ExportError(f"{', '.join(map(str, existing))} exists: --overwrite replaces it")
    for d in existing:
        shutil.rmtree(d)
    try:
        version = out / name / str(opts.version)
        version.mkdir(parents=True)
        shutil.copy2(model_folder / manifest.graph, version / "model.onnx")
        external = manifest.data.get("external_data")  # weights over protobuf's 2 GB (XLM-R large in fp32)
        if external:
            shutil.copy2(model_folder / external, version / external)
        if opts.target == "cpu":
            shutil.copy2(templates[CORE], version / "model.py")
        (out / name / "config.pbtxt").write_text(render_core_config(name, manifest, opts, pad_id, text_name))
        log(
            f"wrote {out / name} (LLMLingua-2 core, target {opts.target}, max_batch_size {opts.max_batch_size})"
        )
        if text_name:
            text_version = out / text_name / str(opts.version)
            text_version.mkdir(parents=True)
            shutil.copy2(templates[COMPRESS], text_version / "model.py")
            shutil.copy2(model_folder / manifest.tokenizer_file, text_version / "tokenizer.json")
            shutil.copy2(model_folder / "manifest.json", text_version / "manifest.json")
            (out / text_name / "config.pbtxt").write_text(
                render_text_config(text_name, name, opts, tokenizer.kind)
            )
            log(
                f"wrote {out / text_name} (a JSON call in, llmlingua's result out; {opts.text_instances} "
                f"CPU instances in front of {name})"
            )
    except BaseException:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        raise
    return out / name
