"""Static INT8 for OpenVINO: NNCF post-training quantization of an fp32 export, written as an
OpenVINO IR folder that `Pruner.load` runs on the OpenVINO backend (`prune export
--precision ov-int8`).

Static: every activation scale is fixed at export from calibration batches, so a passage's
answer never depends on the passages batched beside it (dynamic INT8 takes its scales per
batch). The calibration batches are the engine's own blocks of generic text
(`CALIBRATION_TEXTS`, or the caller's), never evaluation data.
"""

from __future__ import annotations

import contextlib
import io

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from engine.errors import ExportError
from engine.pipeline.spec import Manifest

#: generic text for calibration (written for this purpose; no evaluation set): the engine
#: blocks each question with all of them, as a call would
CALIBRATION_TEXTS = [
    "The museum opened in a former railway station. Its collection covers two centuries of painting and "
    "sculpture. Visitors enter through the old ticket hall, which still has its clock.",
    "Bread rises because yeast turns sugar into carbon dioxide. The gas is trapped by gluten, a network of "
    "proteins formed when flour is mixed with water and kneaded. Baking sets the structure.",
    "The river floods most springs when snow melts in the mountains. Farmers on the plain built levees in "
    "the last century. Since then the town has moved its market to higher ground.",
    "A compiler translates source code into machine instructions. It first parses the text into a tree, then "
    "checks types, and finally emits code for the target processor. Some compilers optimise in between.",
    "The committee meets every second Tuesday. Minutes are published a week later on the council's website. "
    "Members of the public may ask questions in writing before the meeting.",
    "Penguins live almost exclusively in the southern hemisphere. They cannot fly, but their wings work as "
    "flippers under water. Emperor penguins breed during the Antarctic winter.",
    "The treaty was signed in 1648 after long negotiations. It ended decades of war and redrew several "
    "borders. Historians still debate how much it changed the balance of power.",
    "To reset the router, hold the button on the back for ten seconds. The lights will blink and then turn "
    "green. Reconnect your devices using the password printed on the label.",
]
CALIBRATION_QUESTIONS = [
    "What is this about?",
    "When did it happen?",
    "Who made it?",
    "How does it work?",
    "Where is it?",
    "Why did it change?",
]


@dataclass(frozen=True)
class QuantizationSettings:
    """NNCF's knobs, as `prune export --precision ov-int8` records them in the manifest."""

    preset: str = "mixed"  # "performance" (symmetric activations) or "mixed" (asymmetric)
    model_type: str | None = (
        "transformer"  # NNCF's transformer scheme (keeps softmax, layer norms, ... float)
    )
    fast_bias_correction: bool = True
    smooth_quant_alpha: float | None = None  # None: NNCF's default for transformers; <0: off
    ignored_types: tuple[str, ...] = ()  # operator types left in float
    #: node-name regular expressions left in float. The default keeps two kinds float, chosen
    #: by fidelity on the default model (docs/precisions.md): the contract's pooling products
    #: (sentence and passage means, `/model/MatMul*`), and each layer's FFN output projection,
    #: whose GELU input has the widest activation range of the layer.
    ignored_patterns: tuple[str, ...] = (r"/model/MatMul(_\d+)?$", r".*layer\.\d+/output/dense/MatMul")
    subset_size: int = 300


def calibration_feeds(
    fp32: Path, texts: list[str] | None = None, questions: list[str] | None = None
) -> list[dict[str, Any]]:
    """The engine's padded batches of the calibration texts, one feed per block (row)."""
    from engine.measuring import call_batches
    from engine.pruner import Pruner
    from engine.pipeline.text import split_sentences

    pruner = Pruner.load(fp32, threads=1)
    texts = texts or CALIBRATION_TEXTS
    feeds = []
    for q in questions or CALIBRATION_QUESTIONS:
        for b in call_batches(pruner, q, texts, [split_sentences(t) for t in texts]):
            inputs = b.inputs(list(pruner.spec.input_names))
            for r in range(b.shape[0]):
                feeds.append({k: v[r : r + 1] for k, v in inputs.items()})
    pruner.close()
    return feeds


def quantize(
    fp32: str | Path,
    out: str | Path,
    settings: QuantizationSettings = QuantizationSettings(),
    *,
    texts: list[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Manifest:
    """NNCF static INT8 of the fp32 export `fp32` into the OpenVINO IR folder `out`;
    `progress`: NNCF's progress bars (which it prints whatever its log level)."""
    try:
        import nncf
        import openvino as ov
    except ImportError as exc:
        raise ExportError(
            "static INT8 for OpenVINO needs OpenVINO and NNCF: pip install 'prune-engine[openvino]'"
        ) from exc
    fp32, out = Path(fp32), Path(out)
    manifest = Manifest.read(fp32)
    if manifest.precision not in (None, "fp32"):
        raise ExportError(f"{fp32} is a {manifest.precision} export: quantize the fp32 one")
    if Path(manifest.graph).suffix != ".onnx":
        raise ExportError(f"{fp32}: its graph {manifest.graph} is not ONNX")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"{out} exists and is not empty: choose another --out, or --overwrite to write into it"
        )
    t0 = time.perf_counter()
    nncf.set_log_level(logging.WARNING)  # its per-node INFO lines would drown the export's own
    feeds = calibration_feeds(fp32, texts)
    log(f"calibrating on {len(feeds)} blocks of generic text ...")
    model = ov.Core().read_model(str(fp32 / manifest.graph))
    kwargs: dict[str, Any] = {
        "preset": nncf.QuantizationPreset(settings.preset),
        "fast_bias_correction": settings.fast_bias_correction,
        "subset_size": min(settings.subset_size, len(feeds)),
    }
    if settings.model_type:
        kwargs["model_type"] = nncf.ModelType(settings.model_type)
    if settings.ignored_types or settings.ignored_patterns:
        kwargs["ignored_scope"] = nncf.IgnoredScope(
            types=list(settings.ignored_types), patterns=list(settings.ignored_patterns), validate=False
        )
    if settings.smooth_quant_alpha is not None:
        alpha = settings.smooth_quant_alpha
        kwargs["advanced_parameters"] = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=alpha if alpha >= 0 else -1)
        )
    try:
        with _quiet(not progress):
            quantized = nncf.quantize(model, nncf.Dataset(feeds), **kwargs)
    except Exception as exc:
        raise ExportError(
            f"NNCF could not quantize {fp32 / manifest.graph}: {type(exc).__name__}: {exc}"
        ) from exc
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ov.save_model(quantized, str(out / "model.xml"), compress_to_fp16=False)
    for f in fp32.iterdir():  # tokenizer files and the rest, but not the ONNX graph and its weights
        if f.is_file() and f.name not in (manifest.graph, manifest.external_data, "manifest.json"):
            shutil.copy2(f, out / f.name)
    record = {
        **asdict(settings),
        "calibration_blocks": len(feeds),
        "from": str(fp32),
        "seconds": round(time.perf_counter() - t0, 1),
        "nncf": nncf.__version__,
        "openvino": ov.__version__,
    }
    data = {**manifest.data, "openvino": json.loads(json.dumps(record))}
    new = manifest.with_changes(graph="model.xml", external_data=None, precision="ov-int8", data=data)
    new.write(out)
    log(f"static INT8 (OpenVINO IR) in {out} ({record['seconds']} s)")
    return new


@contextlib.contextmanager
def _quiet(quiet: bool):
    """NNCF's progress bars (rich, on stdout and stderr) swallowed when `quiet`."""
    if not quiet:
        yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
