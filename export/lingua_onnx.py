"""LLMLingua-2 checkpoint -> ONNX: the token classifier as `Compressor.load` runs it in ONNX Runtime.

Output folder:
    model.onnx         inputs input_ids, attention_mask (int64 [B, L], both axes dynamic); output
                       token_probs (float32 [B, L]): softmax over the two labels inside the graph,
                       in float32, label 1 (keep), as llmlingua reads it (+ model.onnx.data past 2 GB)
    tokenizer.json ... the checkpoint's tokenizer files as they are (the engine adds llmlingua's
                       [NEW0]..[NEW99] when it loads them, as llmlingua does)
    manifest.json      kind "compressor", family llmlingua2, the layout, the embedding rows (the
                       vocabulary with the 100 added tokens), parity with PyTorch, INT8's gate

The graph carries the embedding rows llmlingua's `resize_token_embeddings` makes after
`seed_everything(42)` (engine.pytorch.llmlingua2): a force token that is not one token runs
as one of them, so an export without them could not keep the words llmlingua keeps.

Each graph (fp32, optimized, INT8) is checked against the PyTorch fp32 module on the built-in
texts' chunks, batched and padded as the Compressor batches them (export.parity's tolerances);
INT8 is then gated against the fp32 graph on word decisions (engine.fidelity_check.lingua_gate:
at least 99% of the word labels equal at the same rates, the token probabilities' Spearman
reported) and refused when it fails.
"""

from __future__ import annotations

import contextlib

import hashlib
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import engine
from engine.errors import ExportError
from engine.pipeline.lingua_decide import CompressOptions, plan
from engine.pipeline.lingua_words import LinguaTokenizer, check_folder, lingua_layout
from engine.pipeline.spec import COMPRESSOR_INPUTS, COMPRESSOR_OUTPUT, MANIFEST_FORMAT, CompressorManifest
from export.folders import EXTERNAL_DATA_BYTES, created, exported_with, move_into, step_path
from export.parity import FP16_TOLERANCE, INT8_TOLERANCE

#: the tokenizer files an export carries (those the checkpoint has)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "sentencepiece.bpe.model",
    "vocab.txt",
)

#: the built-in texts the graphs are checked on and INT8 is gated on (written for the engine;
#: English, Chinese, Japanese, Portuguese, German, French, and one text of several chunks)
TEXTS = [
    "The council met on Tuesday to discuss the old bridge over the river. Most members wanted a new one, "
    "but the budget was small, and the engineer said repairs would cost 2.5 million and last ten years.\n"
    "In the end they asked for a second report before the vote in March.",
    "Our team will ship the release next week if the tests pass. Please send the report before Friday, "
    "and keep a copy for the archive! Why did the build fail? Nobody knew, so we read the logs again.",
    "Prices rose 3.2 percent in March, while wages grew only 1.5 percent over the same months; economists "
    "expect the central bank to raise rates at its next meeting.",
    "昨天市议会开会讨论旧桥的问题。大多数人希望建一座新桥，但是预算很少。工程师说修理需要两百万。最后他们要求再写一份报告。",
    "昨日、市議会は古い橋について話し合いました。多くの人は新しい橋を望みましたが、予算は少なかったです。",
    "Ontem a câmara discutiu a velha ponte. A maioria queria uma nova, mas o orçamento era pequeno. Por que "
    "não consertar? O engenheiro disse que o conserto custaria 2,5 milhões!",
    "Der Stadtrat hat gestern über die alte Brücke gesprochen. Die meisten wollten eine neue Brücke bauen.",
    "Le conseil municipal a discuté du vieux pont hier soir, et la plupart des membres voulaient un pont neuf.",
    " ".join(
        f"Report {i} says the river rose {i % 7} meters near the station.\nWorkers moved sand to the old road."
        for i in range(30)
    ),
]
#: the rates INT8's word decisions are compared at
GATE_RATES = (0.33, 0.5)


class TokenProbs(torch.nn.Module):
    """The classifier's probability of label 1 per token: softmax over the labels in float32."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        """token_probs [B, L] of the inputs."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return torch.softmax(logits.float(), dim=-1)[..., 1]


def refuse_options(opts: Any) -> None:
    """ExportError for an export option that has no meaning for LLMLingua-2 (yet)."""
    if opts.precision not in ("fp32", "int8", "fp16"):
        raise ExportError(
            "an LLMLingua-2 export is fp32, int8 or fp16 (INT8 and fp16 behind the word-decision gate), "
            f"not {opts.precision!r}"
        )
    given = [
        name
        for name, value in (
            ("tokenizer", opts.tokenizer),
            ("max_length", opts.max_length),
            ("options", opts.options),
            ("tensorrt_graph", opts.tensorrt_graph),
        )
        if value
    ]
    if given:
        raise ExportError(f"{', '.join(given)}: not options of an LLMLingua-2 export (its window is 512)")


def export_lingua(checkpoint: str | Path, out: Path, opts: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Export the LLMLingua-2 checkpoint `checkpoint` into `out` as `opts` (export.onnx.ExportOptions)
    say; returns the manifest. ExportError on a graph that disagrees with PyTorch, or an INT8 graph
    that fails the gate."""
    from engine.backends.torch import TorchTokenProbs
    from engine.compressor import Compressor
    from engine.pipeline.budget import tiktoken_encoding
    from engine.pytorch.llmlingua2 import load_classifier

    opts.check(out)
    refuse_options(opts)
    t0 = time.perf_counter()
    log(f"loading {checkpoint} (LLMLingua-2) ...")
    config = check_folder(checkpoint)
    tokenizer = LinguaTokenizer.from_folder(checkpoint)
    model = load_classifier(checkpoint, tokenizer.size, attn="eager")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    external = opts.external_data == "always" or (opts.external_data == "auto" and size > EXTERNAL_DATA_BYTES)
    if size > EXTERNAL_DATA_BYTES and opts.external_data == "never":
        raise ExportError("the weights exceed protobuf's 2 GB limit: external data is required")
    encoding = tiktoken_encoding("gpt-3.5-turbo")
    reference = Compressor(tokenizer, TorchTokenProbs(model), encoding)
    feeds = sample_feeds(reference)
    log(
        f"layout {lingua_layout(config)} ({tokenizer.kind}); {tokenizer.size} embedding rows "
        f"(llmlingua's 100 added tokens included); {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        "parameters"
    )
    with tempfile.TemporaryDirectory(prefix="prune-lingua-export-") as tmp:
        work = Path(tmp)
        raw, fp32 = step_path(work, "raw"), step_path(work, "fp32")
        swapped = trace(model, raw, feeds[-1], opts.opset, log, gpu=opts.precision == "fp16")
        save_graph(raw, fp32, external)
        checks = Checks(reference.core, feeds if opts.verify else [], log)
        checks.parity(fp32, "fp32", opts.tolerance)
        graph, details = convert(fp32, work, config, opts, external, checks, log)
        if swapped:  # the GPU graph: what export.gpu traced fused
            details["gpu_graph"] = {"fused_attention_implementations": swapped}
        if opts.precision in ("int8", "fp16"):
            # the fp32 graph the candidate was made from (fp16's conversion optimizes the plain one)
            optimized = opts.optimize and opts.precision == "int8"
            base = work / "optimized" / "model.onnx" if optimized else fp32
            details["gate"] = gate_graph(tokenizer, encoding, base, graph, log, opts.precision)
        stage = work / "out"
        stage.mkdir()
        for item in graph.parent.iterdir():
            shutil.copy2(item, stage / item.name)
        for name in TOKENIZER_FILES:
            if (Path(checkpoint) / name).is_file():
                shutil.copy2(Path(checkpoint) / name, stage / name)
        manifest = manifest_of(checkpoint, config, tokenizer, opts, stage, details, checks.reports)
        CompressorManifest.from_dict(manifest, where=f"the manifest of {out}").write(stage)
        move_into(stage, out)
    log(f"exported LLMLingua-2 ({opts.precision}) to {out} in {time.perf_counter() - t0:.1f} s")
    return manifest


def sample_feeds(compressor: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """The built-in texts' chunks as the compressor makes them, in padded batches of 1, 2 and 3
    chunks of unequal lengths (dynamic batch and length axes), the longest batch last."""
    p = plan(compressor.tokenizer, TEXTS, CompressOptions(force_tokens=("\n",)), compressor.count)
    chunks = sorted((c for cs in p.chunks for c in cs), key=lambda c: len(c.ids))
    feeds, at, size = [], 0, 1
    while at < len(chunks):
        batch = chunks[at : at + size]
        length = max(len(c.ids) for c in batch)
        ids = np.full((len(batch), length), compressor.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.int64)
        for row, c in enumerate(batch):
            ids[row, : len(c.ids)], mask[row, : len(c.ids)] = c.ids, c.mask
        feeds.append((ids, mask))
        at, size = at + size, size % 3 + 1
    return feeds


def trace(
    model: torch.nn.Module,
    graph: Path,
    feed: tuple[np.ndarray, np.ndarray],
    opset: int,
    log,
    gpu: bool = False,
) -> int | None:
    """`torch.onnx.export` of TokenProbs(model) into `graph`, dynamic batch and sequence axes. `gpu`:
    the GPU graph (fp16's), attention traced as MultiHeadAttention as the pruners' (export/gpu.py), so
    that at a fixed shape every node runs on the CUDA provider; returns the implementations swapped."""
    from export import gpu as gpu_graph

    log(f"exporting ONNX (opset {opset}{', the GPU graph' if gpu else ''}) ...")
    axes = {"batch": 0, "sequence": 1}
    dynamic = {n: {v: k for k, v in axes.items()} for n in (*COMPRESSOR_INPUTS, COMPRESSOR_OUTPUT)}
    fused = gpu_graph.fused_attention(model, log) if gpu else contextlib.nullcontext(None)
    try:
        with torch.inference_mode(), warnings.catch_warnings(), fused as swapped:
            warnings.simplefilter("ignore")  # TracerWarnings: the parity checks prove the shapes
            torch.onnx.export(
                TokenProbs(model).eval(),
                tuple(torch.from_numpy(a) for a in feed),
                str(graph),
                input_names=list(COMPRESSOR_INPUTS),
                output_names=[COMPRESSOR_OUTPUT],
                dynamic_axes=dynamic,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:
        raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
    return swapped


def save_graph(raw: Path, fp32: Path, external: bool) -> None:
    """The traced graph as the fp32 graph, marked for the optimizer and the engine, checked by onnx."""
    import onnx

    proto = onnx.load(str(raw))
    proto.producer_name, proto.producer_version = "pytorch", torch.__version__
    onnx.helper.set_model_props(proto, {"prune-engine": engine.__version__, "family": "llmlingua2"})
    if external:
        onnx.save_model(
            proto, str(fp32), save_as_external_data=True, location="model.onnx.data", size_threshold=1024
        )
    else:
        onnx.save_model(proto, str(fp32))
    onnx.checker.check_model(str(fp32))


class Checks:
    """Each graph against the PyTorch module on the sample feeds (none: not verifying)."""

    def __init__(self, reference: Any, feeds: list, log: Callable[[str], None]):
        self.expected = [reference.token_probs(ids, mask) for ids, mask in feeds]
        self.feeds, self.log, self.reports = feeds, log, []

    def parity(self, graph: Path, step: str, tol: float) -> None:
        """ExportError when `graph`'s token probabilities (the attended tokens') differ from
        PyTorch's by more than `tol`."""
        if not self.feeds:
            return
        from engine.backends.onnxruntime import OrtTokenProbs

        self.log(f"checking the {step} graph against PyTorch ...")
        core = OrtTokenProbs(graph, intra_op_threads=None)
        worst = 0.0
        for (ids, mask), expected in zip(self.feeds, self.expected):
            got = core.token_probs(ids, mask)
            if got.shape != ids.shape or not np.isfinite(got).all():
                raise ExportError(f"the {step} graph gave shape {got.shape} or NaN for a batch {ids.shape}")
            worst = max(worst, float(np.abs(got - expected)[mask.astype(bool)].max()))
        report = {
            "step": step,
            "max_abs_diff_token_probs": worst,
            "batches": len(self.feeds),
            "tolerance": tol,
        }
        self.reports.append(report)
        if worst > tol:
            raise ExportError(
                f"the {step} graph disagrees with PyTorch: max |diff| {worst:.3g} > tolerance {tol:g}"
            )
        self.log(f"parity OK ({step}): max |diff| token probs {worst:.2e} over {len(self.feeds)} batches")


def convert(
    fp32: Path,
    work: Path,
    config: dict,
    opts: Any,
    external: bool,
    checks: Checks,
    log: Callable[[str], None],
) -> tuple[Path, dict[str, Any]]:
    """The graph the export ships: `fp32` optimized (`opts.optimize`), then INT8 (`opts.precision`),
    or fp16 (converted from the plain fp32 graph, which its conversion optimizes: Softmax, LayerNorm
    and the classifier in float32, float32 in and out), each checked against PyTorch; that graph, and
    what each step did."""
    from export.optimize import convert_fp16, optimize_graph, quantize_int8

    current, details = fp32, {}
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    if opts.precision == "fp16":
        log("converting to fp16 (ONNX Runtime transformer optimizer, then float16) ...")
        half = step_path(work, "fp16")
        details["fp16"] = convert_fp16(
            fp32, half, heads, hidden, keep_layernorm_fp32=True, external_data=external
        )
        details["fusions"] = details["fp16"].pop("fusions")
        checks.parity(half, "fp16", FP16_TOLERANCE)
        return half, details
    if opts.optimize:
        log("optimizing the graph (ONNX Runtime transformer optimizer) ...")
        opt = step_path(work, "optimized")
        details["fusions"] = optimize_graph(current, opt, heads, hidden, external_data=external)
        log(f"fused: {details['fusions'] or 'nothing'}")
        checks.parity(opt, "fp32 optimized", opts.tolerance)
        current = opt
    if opts.precision == "int8":
        log(f"quantizing to INT8 ({opts.int8_weight_type}, per_channel={opts.int8_per_channel}) ...")
        q = step_path(work, "int8")
        details["quantization"] = quantize_int8(
            current, q, opts.int8_weight_type, opts.int8_per_channel, external
        )
        checks.parity(q, "int8", INT8_TOLERANCE)
        current = q
    return current, details


def gate_graph(tokenizer: Any, encoding: Any, fp32: Path, graph: Path, log, precision: str) -> dict[str, Any]:
    """The word decisions of `graph` (INT8's or fp16's: `precision`) against the fp32 graph's
    (`fp32`: the one it was made from) on the built-in texts (engine.fidelity_check.lingua_gate);
    ExportError when they fail the gate."""
    from engine.backends.onnxruntime import OrtTokenProbs
    from engine.compressor import Compressor
    from engine.fidelity_check import lingua_gate

    base = Compressor(tokenizer, OrtTokenProbs(fp32), encoding)
    candidate = Compressor(tokenizer, OrtTokenProbs(graph), encoding)
    log(
        f"gating the {precision} graph against fp32 on word decisions ({len(TEXTS)} texts, rates {GATE_RATES}) ..."
    )
    report = lingua_gate(base, candidate, TEXTS, GATE_RATES)
    log(f"{precision}: {'passes' if report['passed'] else 'fails'} the gate ({report['reason']})")
    if not report["passed"]:
        raise ExportError(
            f"the {precision} graph fails the fidelity gate: {report['reason']}; nothing was written "
            "(export fp32 instead: --precision fp32)"
        )
    return report


def weights_sha256(folder: Path) -> str:
    """The sha256 of a checkpoint's safetensors files, in name order (the manifest's `source`)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def manifest_of(
    checkpoint: str | Path,
    config: dict,
    tokenizer: LinguaTokenizer,
    opts: Any,
    stage: Path,
    details: dict[str, Any],
    checks: list[dict[str, Any]],
) -> dict[str, Any]:
    """The manifest of the export staged in `stage` (engine.pipeline.spec.CompressorManifest reads it)."""

    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "kind": "compressor",
        "family": "llmlingua2",
        "layout": lingua_layout(config),
        "graph": "model.onnx",
        "external_data": "model.onnx.data" if (stage / "model.onnx.data").exists() else None,
        "precision": opts.precision,
        "optimized": bool(opts.optimize),
        **details,
        "opset": opts.opset,
        "inputs": list(COMPRESSOR_INPUTS),
        "outputs": [COMPRESSOR_OUTPUT],
        "output": "token_probs: softmax over the two labels (float32, in the graph), label 1 (keep), per token",
        "max_length": 512,
        "tokenizer": {"file": "tokenizer.json", "kind": tokenizer.kind, "added_tokens": "[NEW0]..[NEW99]"},
        # the word-embedding rows: the vocabulary with llmlingua's 100 added tokens, made as it makes them
        "embedding_rows": tokenizer.size,
        "added_rows": "transformers' resize_token_embeddings after torch.manual_seed(42), as llmlingua 0.2.2",
        "source": {
            "checkpoint": str(Path(checkpoint).resolve()),
            "weights_sha256": weights_sha256(Path(checkpoint)),
            "num_attention_heads": config.get("num_attention_heads"),
            "hidden_size": config.get("hidden_size"),
        },
        "exported_with": exported_with(),
        "created": created(),
    }
    if opts.verify:
        manifest["verification"] = checks[-1] if checks else None
        manifest["verification_steps"] = checks
    return manifest
