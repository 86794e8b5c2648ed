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
"""
from __future__ import annotations

import datetime as _dt
import shutil
import contextlib
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import engine
from engine.batching import BatchingConfig
from engine.encode import Encoder
from engine.errors import ExportError
from engine.pytorch.loading import embedding_rows, load_torch_model
from engine.spec import GRAPH_OUTPUTS, MANIFEST_FORMAT, Manifest, ModelSpec
from export import deberta
from export.optimize import convert_fp16, encoder_dims, fix_graph, optimize_graph, quantize_int8
from export.samples import sample_batches

DEFAULT_OPSET = 17
EXTERNAL_DATA_BYTES = 1_800_000_000   # protobuf's hard limit is 2 GiB for the whole file
PARITY_TOLERANCE = 1e-4               # fp32 graph vs fp32 PyTorch, on probabilities and scores
# Gates for the reduced precisions on the sample inputs (max |diff| of a probability or
# a score); they catch a broken conversion. The fidelity a user can expect is measured
# on a corpus by `prune fidelity` (docs/precisions.md).
INT8_TOLERANCE = 0.15
FP16_TOLERANCE = 0.02
PRECISIONS = ("fp32", "int8", "fp16")


#: transformers modules whose helpers some releases compile with `torch.jit.script`
#: (5.17 does for DeBERTa; 5.24 does not): exported as they are, each scripted helper
#: becomes an ONNX `If` per layer, and ONNX Runtime's optimizer then takes minutes
#: (12 s, 67 s, 197 s at 2, 4, 6 layers with transformers 5.17; 1.8 s and 4.2 s with 5.24).
SCRIPTED_HELPER_MODULES = ("transformers.models.deberta_v2.modeling_deberta_v2",
                           "transformers.models.deberta.modeling_deberta")


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
        log(f"tracing {len(swapped)} helpers this transformers compiles with torch.jit.script "
            f"({', '.join(a for _, a, _ in swapped)}) as plain Python")
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


def compare(reference: Callable[[dict], tuple], candidate: Callable[[dict], tuple],
            batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Max |diff| of rerank scores and of valid sentence probabilities over `batches`."""
    max_prob = max_rerank = 0.0
    for feed in batches:
        r_ref, p_ref = reference(feed)
        r_got, p_got = candidate(feed)
        if p_got.shape != p_ref.shape or r_got.shape != r_ref.shape:
            raise ExportError(f"shape mismatch: {p_got.shape} vs {p_ref.shape}")
        if not (np.isfinite(p_got).all() and np.isfinite(r_got).all()):
            raise ExportError("the graph produced NaN or inf")
        max_prob = max(max_prob, float(np.abs(p_got - p_ref).max(initial=0.0)))
        max_rerank = max(max_rerank, float(np.abs(r_got - r_ref).max(initial=0.0)))
    return {"max_abs_diff_sentence_probs": max_prob, "max_abs_diff_rerank_score": max_rerank,
            "batches": len(batches)}


def torch_runner(model: torch.nn.Module, spec: ModelSpec) -> Callable[[dict], tuple]:
    """A function running the PyTorch model on a feed, for the export's checks."""
    def run(feed: dict[str, np.ndarray]):
        t = {k: torch.from_numpy(v) for k, v in feed.items()}
        with torch.inference_mode():
            r, p = model(t["input_ids"], t["attention_mask"], t["sentence_ids"], t.get("token_type_ids"))
        return r.numpy(), p.numpy()
    return run


def ort_runner(graph: Path) -> Callable[[dict], tuple]:
    """A function running the ONNX graph in ONNX Runtime on a feed, for the export's checks."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(feed: dict[str, np.ndarray]):
        return tuple(sess.run(list(GRAPH_OUTPUTS), {n: feed[n] for n in names}))
    return run


def _step_path(tmp_dir: Path, step: str) -> Path:
    folder = tmp_dir / step
    folder.mkdir()
    return folder / "model.onnx"


def family_options(model: torch.nn.Module) -> dict[str, Any]:
    """Options baked into the graph that a reader of the manifest should know."""
    from engine.pytorch.modeling import EmbeddingHighlighterModel
    if isinstance(model, EmbeddingHighlighterModel):
        return {"mode": model.mode, "pooling": model.pooling, "scale": model.scale,
                "shift": model.shift, "rerank": model.rerank,
                "probability": "sigmoid(scale * (cosine - shift))"}
    return {}


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def export_model(checkpoint: str | Path, out: str | Path, *, family: str | None = None,
                 tokenizer: str | Path | None = None, max_length: int | None = None,
                 opset: int = DEFAULT_OPSET, external_data: str = "auto", verify: bool = True,
                 tolerance: float = PARITY_TOLERANCE, overwrite: bool = False,
                 options: dict[str, Any] | None = None, precision: str = "fp32",
                 optimize: bool = True, int8_weight_type: str = "QInt8", int8_per_channel: bool = True,
                 tensorrt_graph: bool = False,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Export `checkpoint` into `out`; returns the manifest. Raises ExportError on mismatch."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty: choose another --out, or --overwrite to write into it")
    if external_data not in ("auto", "always", "never"):
        raise ExportError("external_data must be auto, always or never")
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    t0 = time.perf_counter()
    log(f"loading {checkpoint} ...")
    tm = load_torch_model(checkpoint, family=family, tokenizer=tokenizer, max_length=max_length, options=options)
    model, tok, spec, ck, hf_tok = tm.module, tm.tokenizer, tm.spec, tm.checkpoint, tm.hf_tokenizer
    fam = spec.family
    rows = embedding_rows(model) or len(hf_tok)   # load_torch_model checked the tokenizer against it
    log(f"family {fam.name} ({fam.description}); window {spec.max_length} tokens; "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    encoder = Encoder(tok, spec)
    input_names = list(spec.input_names)
    wrapper = _ContractModule(model, fam.uses_token_type_ids).eval()
    example = sample_batches(encoder, batch_sizes=(2,))[0]
    args = tuple(torch.from_numpy(example[n]) for n in input_names)
    dynamic_axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    dynamic_axes["rerank_score"] = {0: "batch"}
    dynamic_axes["sentence_probs"] = {0: "batch", 1: "sentences"}
    big = _param_bytes(model) > EXTERNAL_DATA_BYTES
    use_external = external_data == "always" or (external_data == "auto" and big)
    if big and external_data == "never":
        raise ExportError("the weights exceed protobuf's 2 GB limit: external data is required")

    with tempfile.TemporaryDirectory(prefix="prune-export-") as tmp:
        tmp_dir = Path(tmp)
        raw_graph = tmp_dir / "raw" / "model.onnx"
        raw_graph.parent.mkdir()
        log(f"exporting ONNX (opset {opset}) ...")
        try:
            with torch.inference_mode(), warnings.catch_warnings(), traced_helpers(log), \
                    deberta.shared_position_indices(model, log):
                # TracerWarnings about Python branches on shapes are expected; the parity
                # check below is what proves the graph generalises across shapes.
                warnings.simplefilter("ignore")
                torch.onnx.export(wrapper, args, str(raw_graph), input_names=input_names,
                                  output_names=list(GRAPH_OUTPUTS), dynamic_axes=dynamic_axes,
                                  opset_version=opset, do_constant_folding=True, dynamo=False)
        except Exception as exc:
            raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
        stage = tmp_dir / "out"
        stage.mkdir()
        import onnx
        proto = onnx.load(str(raw_graph))  # also pulls any external files torch wrote
        # The transformer optimizer checks the producer; our own mark goes in the metadata.
        proto.producer_name, proto.producer_version = "pytorch", torch.__version__
        onnx.helper.set_model_props(proto, {"prune-engine": engine.__version__, "family": fam.name})
        fp32 = _step_path(tmp_dir, "fp32")
        if use_external:
            onnx.save_model(proto, str(fp32), save_as_external_data=True, all_tensors_to_one_file=True,
                            location="model.onnx.data", size_threshold=1024)
        else:
            onnx.save_model(proto, str(fp32))
        del proto
        onnx.checker.check_model(str(fp32))
        hf_tok.save_pretrained(str(stage))
        # the tokenizer the engine runs: the checkpoint's own tokenizer.json where it has one
        # (engine.pytorch.loading.checkpoint_tokenizer), never a rebuilt one
        tok.save(str(stage / "tokenizer.json"))
        if not (stage / "tokenizer.json").is_file():
            raise ExportError("the tokenizer could not be saved as tokenizer.json (fast tokenizer)")

        checks: list[dict[str, Any]] = []
        reference = torch_runner(model, spec)
        batches = sample_batches(encoder) if verify else []

        def check(graph: Path, step: str, tol: float) -> None:
            if not verify:
                return
            log(f"checking the {step} graph against PyTorch ...")
            report = compare(reference, ort_runner(graph), batches)
            report.update(step=step, tolerance=tol)
            checks.append(report)
            worst = max(report["max_abs_diff_sentence_probs"], report["max_abs_diff_rerank_score"])
            if worst > tol:
                raise ExportError(f"the {step} graph disagrees with PyTorch: max |diff| {worst:.3g} "
                                  f"> tolerance {tol:g} ({report})")
            log(f"parity OK ({step}): max |diff| probs {report['max_abs_diff_sentence_probs']:.2e}, "
                f"rerank {report['max_abs_diff_rerank_score']:.2e} over {report['batches']} batches")

        check(fp32, "fp32", tolerance)
        current = fp32
        details: dict[str, Any] = {}
        heads, hidden = encoder_dims(ck.config)
        if optimize:
            log("optimizing the graph (ONNX Runtime transformer optimizer) ...")
            opt = _step_path(tmp_dir, "optimized")
            details["fusions"] = optimize_graph(current, opt, heads, hidden, external_data=use_external)
            log(f"fused: {details['fusions'] or 'nothing'}")
            check(opt, "fp32 optimized", tolerance)
            current = opt
        if precision == "int8":
            log(f"quantizing to INT8 ({int8_weight_type}, per_channel={int8_per_channel}) ...")
            q = _step_path(tmp_dir, "int8")
            details["quantization"] = quantize_int8(current, q, int8_weight_type, int8_per_channel, use_external)
            check(q, "int8", INT8_TOLERANCE)
            current = q
        elif precision == "fp16":
            log("converting to FP16 (float32 inputs/outputs, softmax, heads and pooling) ...")
            h = _step_path(tmp_dir, "fp16")
            # from the plain fp32 graph: the optimizer then fuses for the GPU, SkipLayerNormalization
            # included (the CPU graph's is split back, export.optimize.unfuse_skip_layer_norm)
            details["fp16"] = convert_fp16(fp32, h, heads, hidden, fam.backbone == "deberta-v2", use_external)
            check(h, "fp16", FP16_TOLERANCE)
            current = h
        for item in current.parent.iterdir():
            shutil.copy2(item, stage / item.name)
        if tensorrt_graph:
            # TensorRT parses the plain fp32 graph (not ONNX Runtime's fused contrib ops).
            trt_proto = onnx.load(str(fp32))
            details["tensorrt_graph_fixes"] = fix_graph(trt_proto)
            onnx.save_model(trt_proto, str(stage / "model.trt.onnx"), save_as_external_data=use_external,
                            all_tensors_to_one_file=True, location="model.trt.onnx.data")
            del trt_proto

        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "family": fam.name,
            "defaults": {"threshold": fam.threshold, "keep_rule": fam.keep_rule, "title": fam.title,
                         "backoff_alpha": fam.backoff_alpha, "lexical_weight": fam.lexical_weight,
                         "lexical_threshold": fam.lexical_threshold, "passage_margin": fam.passage_margin},
            "max_length": spec.max_length,
            "buckets": list(BatchingConfig().buckets_for(spec.max_length)),
            "graph": "model.onnx",
            "external_data": "model.onnx.data" if (stage / "model.onnx.data").exists() else None,
            "precision": precision,
            "optimized": bool(optimize),
            **details,
            "opset": opset,
            "inputs": input_names,
            "outputs": list(GRAPH_OUTPUTS),
            "tokenizer": {"file": "tokenizer.json", "class": type(hf_tok).__name__,
                          "vocab_size": len(hf_tok), "seps_between": fam.seps_between,
                          **spec.special_tokens()},
            # input_ids must stay below this (the word-embedding rows): servers check it
            "embedding_rows": rows,
            # absolute for a local folder, so `prune fidelity` finds it from any folder
            "source": {"checkpoint": str(Path(checkpoint).resolve()) if Path(str(checkpoint)).exists()
                       else str(checkpoint), "weights_sha256": ck.weights_sha256,
                       "num_attention_heads": heads, "hidden_size": hidden},
            "options": family_options(model),
            "exported_with": {"engine": engine.__version__, "torch": torch.__version__,
                              "transformers": __import__("transformers").__version__,
                              "onnx": onnx.__version__,
                              "onnxruntime": __import__("onnxruntime").__version__},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        if verify:
            manifest["verification"] = checks[-1]
            manifest["verification_steps"] = checks
        Manifest.from_dict(manifest, where=f"the manifest of {out}").write(stage)   # written as it is read
        out.mkdir(parents=True, exist_ok=True)
        for item in stage.iterdir():
            target = out / item.name
            if target.exists():
                target.unlink() if target.is_file() else shutil.rmtree(target)
            shutil.move(str(item), str(target))
    log(f"exported {fam.name} to {out} in {time.perf_counter() - t0:.1f} s")
    return manifest
