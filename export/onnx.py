"""Checkpoint -> one ONNX graph with the engine's contract, checked against PyTorch.

Output folder:
    model.onnx            the graph (+ model.onnx.data when weights exceed protobuf's 2 GB)
    tokenizer.json ...    the checkpoint's tokenizer (fast)
    manifest.json         family, defaults, window, special tokens, opset, source hash,
                          and the measured parity with PyTorch

Why `torch.onnx.export` and not optimum: optimum's exporter does not know these custom
heads and `optimum-onnx` pins transformers<4.58; the legacy TorchScript exporter traces
the reference module exactly (max diff < 1e-6 here) in under a second for small models.
Attention runs in the "eager" implementation, the one ONNX Runtime's transformer
optimizer can fuse.

`export_model` runs named steps, each callable alone: `load`, `trace`, `save_fp32`,
`save_tokenizer`, `convert` (optimize, then INT8 or FP16), each graph checked against
PyTorch (export/parity.py), `save_tensorrt_graph`, `manifest_of` and `move_into`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import engine
from engine.errors import ExportError
from engine.pipeline.encode import BatchingConfig, Encoder
from engine.pipeline.families import Family
from engine.pipeline.lingua_words import is_lingua_checkpoint
from engine.pipeline.spec import GRAPH_OUTPUTS, MANIFEST_FORMAT, Manifest
from engine.pytorch.torch_model import TorchModel, embedding_rows, load_torch_model
from export import deberta
from export import gpu as gpu_graph
from export.folders import EXTERNAL_DATA_BYTES, created, exported_with, move_into
from export.folders import step_path as _step_path
from export.optimize import convert_fp16, encoder_dims, fix_graph, optimize_graph, quantize_int8
from export.parity import FP16_TOLERANCE, INT8_TOLERANCE, PARITY_TOLERANCE, Parity
from export.samples import sample_batches
from export.tensorrt import TRT_GRAPH

DEFAULT_OPSET = 17
PRECISIONS = ("fp32", "int8", "fp16")


#: transformers modules whose helpers some releases compile with `torch.jit.script`
#: (5.17 does for DeBERTa; 5.24 does not): exported as they are, each scripted helper
#: becomes an ONNX `If` per layer, and ONNX Runtime's optimizer then takes minutes
#: (12 s, 67 s, 197 s at 2, 4, 6 layers with transformers 5.17; 1.8 s and 4.2 s with 5.24).
SCRIPTED_HELPER_MODULES = (
    "transformers.models.deberta_v2.modeling_deberta_v2",
    "transformers.models.deberta.modeling_deberta",
)


@contextlib.contextmanager
def traced_helpers(log: Callable[[str], None] = lambda m: None):
    """While exporting, the Python functions behind the scripted helpers of
    SCRIPTED_HELPER_MODULES (torch keeps each as `_torchdynamo_inline`), so that the
    exporter traces them as every other op: the graph gets no `If` nodes. The branches
    are taken at trace time, as in the rest of the model (self-attention: query and key
    lengths equal); the parity check after export runs other lengths."""
    import sys

    swapped: list[tuple[Any, str, Any]] = []
    for name in SCRIPTED_HELPER_MODULES:
        module = sys.modules.get(name)
        for attr, value in list(vars(module).items()) if module is not None else []:
            original = getattr(value, "_torchdynamo_inline", None)
            if isinstance(value, torch.jit.ScriptFunction) and callable(original):
                swapped.append((module, attr, value))
                setattr(module, attr, original)
    if swapped:
        log(
            f"tracing {len(swapped)} helpers this transformers compiles with torch.jit.script "
            f"({', '.join(a for _, a, _ in swapped)}) as plain Python"
        )
    try:
        yield
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)


class _ContractModule(torch.nn.Module):
    """Orders the reference module's arguments as the graph's inputs."""

    def __init__(self, model: torch.nn.Module, with_token_types: bool):
        super().__init__()
        self.model = model
        self.with_token_types = with_token_types

    def forward(self, input_ids, attention_mask, *rest):
        if self.with_token_types:
            token_type_ids, sentence_ids = rest
        else:
            (sentence_ids,), token_type_ids = rest, None
        return self.model(input_ids, attention_mask, sentence_ids, token_type_ids)


def family_options(model: torch.nn.Module) -> dict[str, Any]:
    """Options baked into the graph that a reader of the manifest should know."""
    from engine.pytorch.embedding import EmbeddingHighlighterModel

    if isinstance(model, EmbeddingHighlighterModel):
        return {
            "mode": model.mode,
            "pooling": model.pooling,
            "scale": model.scale,
            "shift": model.shift,
            "rerank": model.rerank,
            "probability": "sigmoid(scale * (cosine - shift))",
        }
    return {}


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True)
class ExportOptions:
    """How `export_model` makes the graph and checks it: its keywords, as one value."""

    family: str | None = None  # None: detected from the checkpoint
    tokenizer: str | Path | None = None  # None: the checkpoint's own
    max_length: int | None = None  # None: the family's window
    opset: int = DEFAULT_OPSET
    external_data: str = "auto"  # auto (over EXTERNAL_DATA_BYTES), always or never
    verify: bool = True  # each graph against PyTorch on the sample batches
    tolerance: float = PARITY_TOLERANCE  # the fp32 graphs' (the reduced precisions have their own)
    overwrite: bool = False  # write into a folder that holds files
    options: dict[str, Any] | None = None  # the family's options (load_torch_model)
    precision: str = "fp32"  # one of PRECISIONS
    optimize: bool = True  # ONNX Runtime's transformer optimizer
    int8_weight_type: str = "QInt8"
    int8_per_channel: bool = True
    tensorrt_graph: bool = False  # also model.trt.onnx, the fp32 graph TensorRT builds from

    def check(self, out: Path) -> None:
        """ExportError when `out` holds files (without `overwrite`) or an option has no such value."""
        if out.exists() and any(out.iterdir()) and not self.overwrite:
            raise ExportError(
                f"{out} exists and is not empty: choose another --out, or --overwrite to write into it"
            )
        if self.external_data not in ("auto", "always", "never"):
            raise ExportError("external_data must be auto, always or never")
        if self.precision not in PRECISIONS:
            raise ExportError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


@dataclass(frozen=True)
class Source:
    """A checkpoint loaded for export, with what the steps derive from it once."""

    model: TorchModel  # module, tokenizer (checked against the embeddings), spec, checkpoint
    encoder: Encoder  # the engine's blocks, for the sample batches
    external: bool  # the graphs keep their weights apart (model.onnx.data)
    rows: int  # the word-embedding rows: input_ids stay below

    @property
    def family(self) -> Family:
        """The checkpoint's family."""
        return self.model.spec.family

    @property
    def dims(self) -> tuple[int, int]:
        """(attention heads, hidden size) of the backbone, for the optimizer."""
        return encoder_dims(self.model.checkpoint.config)


def export_model(
    checkpoint: str | Path, out: str | Path, *, log: Callable[[str], None] = print, **options: Any
) -> dict[str, Any]:
    """Export `checkpoint` into `out`; returns the manifest. Raises ExportError on mismatch.
    `options`: ExportOptions' fields (family, precision, verify, tensorrt_graph, ...)."""
    return export(checkpoint, Path(out), ExportOptions(**options), log)


def export(
    checkpoint: str | Path, out: Path, opts: ExportOptions, log: Callable[[str], None]
) -> dict[str, Any]:
    """export_model's steps, in order: load, trace the fp32 graph, check it and convert it
    (each step checked), the TensorRT graph, the manifest, the folder moved into `out`. An
    LLMLingua-2 checkpoint (detected from its config.json, or `family="llmlingua2"`) is
    export/lingua_onnx.py's."""
    if opts.family == "llmlingua2" or (opts.family is None and is_lingua_checkpoint(checkpoint)):
        from export.lingua_onnx import export_lingua

        return export_lingua(checkpoint, out, opts, log)
    opts.check(out)
    t0 = time.perf_counter()
    source = load(checkpoint, opts, log)
    with tempfile.TemporaryDirectory(prefix="prune-export-") as tmp:
        work = Path(tmp)
        raw, fp32 = _step_path(work, "raw"), _step_path(work, "fp32")
        # the fp16 graph is the GPU's: attention traced fused, one sentence column per position
        details: dict[str, Any] = {
            "gpu_graph": trace(source, raw, opts.opset, log, gpu=opts.precision == "fp16")
        }
        stage = work / "out"
        stage.mkdir()
        save_fp32(raw, fp32, source)
        save_tokenizer(source.model, stage)
        parity = Parity.against(source.model, source.encoder, opts.verify, log)
        parity.check(fp32, "fp32", opts.tolerance)
        graph, converted = convert(source, fp32, work, opts, parity, log)
        details = {**converted, **details} if details["gpu_graph"] else converted
        for item in graph.parent.iterdir():
            shutil.copy2(item, stage / item.name)
        if opts.tensorrt_graph:
            plain = fp32
            if details.get("gpu_graph"):  # TensorRT parses standard ops: a plain trace of its own
                plain = _step_path(work, "plain")
                trace(source, plain, opts.opset, log)
            details["tensorrt_graph_fixes"] = save_tensorrt_graph(plain, stage, source.external)
        manifest = manifest_of(checkpoint, source, opts, stage, details, parity.reports)
        Manifest.from_dict(manifest, where=f"the manifest of {out}").write(stage)  # written as it is read
        move_into(stage, out)
    log(f"exported {source.family.name} to {out} in {time.perf_counter() - t0:.1f} s")
    return manifest


def load(checkpoint: str | Path, opts: ExportOptions, log: Callable[[str], None]) -> Source:
    """The checkpoint loaded for PyTorch (its tokenizer checked), and whether its graph needs
    external data; ExportError when it does and `opts` forbids it."""
    log(f"loading {checkpoint} ...")
    tm = load_torch_model(
        checkpoint,
        family=opts.family,
        tokenizer=opts.tokenizer,
        max_length=opts.max_length,
        options=opts.options,
    )
    fam = tm.spec.family
    rows = embedding_rows(tm.module) or len(
        tm.hf_tokenizer
    )  # load_torch_model checked the tokenizer against it
    log(
        f"family {fam.name} ({fam.description}); window {tm.spec.max_length} tokens; "
        f"{sum(p.numel() for p in tm.module.parameters()) / 1e6:.1f}M parameters"
    )
    encoder = Encoder(tm.tokenizer, tm.spec)
    big = _param_bytes(tm.module) > EXTERNAL_DATA_BYTES
    if big and opts.external_data == "never":
        raise ExportError("the weights exceed protobuf's 2 GB limit: external data is required")
    return Source(tm, encoder, opts.external_data == "always" or (opts.external_data == "auto" and big), rows)


def trace(
    source: Source, graph: Path, opset: int, log: Callable[[str], None], gpu: bool = False
) -> dict | None:
    """`torch.onnx.export` of the family's module into `graph`: the contract's inputs and
    outputs, dynamic batch, sequence and sentence axes, traced on a sample batch. `gpu`:
    the GPU graph (export/gpu.py: fused attention, a sentence column per position); returns
    what it fused then (None for the plain graph)."""
    spec = source.model.spec
    input_names = list(spec.input_names)
    wrapper = _ContractModule(source.model.module, spec.family.uses_token_type_ids).eval()
    example = sample_batches(source.encoder, batch_sizes=(2,))[0]
    args = tuple(torch.from_numpy(example[n]) for n in input_names)
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dynamic_axes["rerank_score"] = {0: "batch"}
    dynamic_axes["sentence_probs"] = {0: "batch", 1: "sequence" if gpu else "sentences"}
    log(f"exporting ONNX (opset {opset}{', the GPU graph' if gpu else ''}) ...")
    fused = gpu_graph.fused_attention(source.model.module, log) if gpu else contextlib.nullcontext(None)
    try:
        with (
            torch.inference_mode(),
            warnings.catch_warnings(),
            traced_helpers(log),
            deberta.shared_position_indices(source.model.module, log),
            fused as swapped,
        ):
            # TracerWarnings about Python branches on shapes are expected; the parity
            # check after export is what proves the graph generalises across shapes.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                args,
                str(graph),
                input_names=input_names,
                output_names=list(GRAPH_OUTPUTS),
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:
        raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
    # one sentence column per token position: consumers read the first max(sentence_ids) + 1
    return {"fused_attention_implementations": swapped, "sentence_columns": "sequence"} if gpu else None


def save_fp32(raw: Path, fp32: Path, source: Source) -> None:
    """The traced graph `raw` as the fp32 graph `fp32` (its weights apart where `source`
    needs it), marked for the optimizer and the engine, and checked by onnx."""
    import onnx

    proto = onnx.load(str(raw))  # also pulls any external files torch wrote
    # The transformer optimizer checks the producer; our own mark goes in the metadata.
    proto.producer_name, proto.producer_version = "pytorch", torch.__version__
    onnx.helper.set_model_props(proto, {"prune-engine": engine.__version__, "family": source.family.name})
    if source.external:
        onnx.save_model(
            proto,
            str(fp32),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(proto, str(fp32))
    del proto
    onnx.checker.check_model(str(fp32))


def save_tokenizer(tm: TorchModel, stage: Path) -> None:
    """The checkpoint's tokenizer files into `stage`, and tokenizer.json: the tokenizer the
    engine runs, the checkpoint's own tokenizer.json where it has one
    (engine.pytorch.torch_model.checkpoint_tokenizer), never a rebuilt one."""
    tm.hf_tokenizer.save_pretrained(str(stage))
    tm.tokenizer.save(str(stage / "tokenizer.json"))
    if not (stage / "tokenizer.json").is_file():
        raise ExportError("the tokenizer could not be saved as tokenizer.json (fast tokenizer)")


def convert(
    source: Source, fp32: Path, work: Path, opts: ExportOptions, parity: Parity, log: Callable[[str], None]
) -> tuple[Path, dict[str, Any]]:
    """The graph the export ships, made from `fp32` in folders of `work`: optimized
    (`opts.optimize`), then INT8 or FP16 (`opts.precision`), each checked by `parity`; that
    graph, and what each step did (for the manifest)."""
    heads, hidden = source.dims
    current, details = fp32, {}
    # the fp16 conversion runs the optimizer itself, on the fp32 graph: not twice
    if opts.optimize and opts.precision != "fp16":
        log("optimizing the graph (ONNX Runtime transformer optimizer) ...")
        opt = _step_path(work, "optimized")
        details["fusions"] = optimize_graph(current, opt, heads, hidden, external_data=source.external)
        log(f"fused: {details['fusions'] or 'nothing'}")
        parity.check(opt, "fp32 optimized", opts.tolerance)
        current = opt
    if opts.precision == "int8":
        log(f"quantizing to INT8 ({opts.int8_weight_type}, per_channel={opts.int8_per_channel}) ...")
        q = _step_path(work, "int8")
        details["quantization"] = quantize_int8(
            current, q, opts.int8_weight_type, opts.int8_per_channel, source.external
        )
        parity.check(q, "int8", INT8_TOLERANCE)
        current = q
    elif opts.precision == "fp16":
        log("converting to FP16 (float32 inputs/outputs, softmax, heads and pooling) ...")
        h = _step_path(work, "fp16")
        # from the plain fp32 graph: the optimizer then fuses for the GPU, SkipLayerNormalization
        # included (the CPU graph's is split back, export.optimize.unfuse_skip_layer_norm)
        details["fp16"] = convert_fp16(
            fp32, h, heads, hidden, source.family.backbone == "deberta-v2", source.external
        )
        details["fusions"] = details["fp16"].pop("fusions")
        parity.check(h, "fp16", FP16_TOLERANCE)
        current = h
    return current, details


def save_tensorrt_graph(fp32: Path, stage: Path, external: bool) -> dict[str, int]:
    """model.trt.onnx in `stage`: the plain fp32 graph (TensorRT parses it, not ONNX
    Runtime's fused contrib ops) with TensorRT's graph fixes; what was fixed."""
    import onnx

    proto = onnx.load(str(fp32))
    fixes = fix_graph(proto)
    onnx.save_model(
        proto,
        str(stage / TRT_GRAPH),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=TRT_GRAPH + ".data",
    )
    return fixes


def manifest_defaults(fam: Family) -> dict[str, Any]:
    """The manifest's `defaults`: the decision settings an export of family `fam` starts from."""
    return fam.rules.recorded()


def manifest_of(
    checkpoint: str | Path,
    source: Source,
    opts: ExportOptions,
    stage: Path,
    details: dict[str, Any],
    checks: list[dict[str, Any]],
) -> dict[str, Any]:
    """The manifest of the export staged in `stage` (engine.pipeline.spec.Manifest reads it):
    `details`, what the conversion steps did; `checks`, the parity reports."""

    tm, fam = source.model, source.family
    heads, hidden = source.dims
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "family": fam.name,
        "defaults": manifest_defaults(fam),
        "max_length": tm.spec.max_length,
        "buckets": list(BatchingConfig().buckets_for(tm.spec.max_length)),
        "graph": "model.onnx",
        "external_data": "model.onnx.data" if (stage / "model.onnx.data").exists() else None,
        "precision": opts.precision,
        "optimized": bool(opts.optimize),
        **details,
        "opset": opts.opset,
        "inputs": list(tm.spec.input_names),
        "outputs": list(GRAPH_OUTPUTS),
        "tokenizer": {
            "file": "tokenizer.json",
            "class": type(tm.hf_tokenizer).__name__,
            "vocab_size": len(tm.hf_tokenizer),
            "seps_between": fam.seps_between,
            **tm.spec.special_tokens(),
        },
        # input_ids must stay below this (the word-embedding rows): servers check it
        "embedding_rows": source.rows,
        # absolute for a local folder, so `prune fidelity` finds it from any folder
        "source": {
            "checkpoint": str(Path(checkpoint).resolve())
            if Path(str(checkpoint)).exists()
            else str(checkpoint),
            "weights_sha256": tm.checkpoint.weights_sha256,
            "num_attention_heads": heads,
            "hidden_size": hidden,
        },
        "options": family_options(tm.module),
        "exported_with": exported_with(),
        "created": created(),
    }
    if opts.verify:
        manifest["verification"] = checks[-1]
        manifest["verification_steps"] = checks
    return manifest
