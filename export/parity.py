"""Each graph of an export against PyTorch: the runners of both on a feed, the comparison
of their outputs (max |diff| of the rerank scores and of the valid sentence
probabilities) on the sample batches (export/samples.py), and the tolerance each
precision passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from engine.pipeline.encode import Encoder
from engine.errors import ExportError
from engine.pytorch.torch_model import TorchModel
from engine.pipeline.spec import GRAPH_OUTPUTS, ModelSpec
from export.samples import sample_batches

PARITY_TOLERANCE = 1e-4  # fp32 graph vs fp32 PyTorch, on probabilities and scores
# Gates for the reduced precisions on the sample inputs (max |diff| of a probability or
# a score); they catch a broken conversion. The fidelity a user can expect is measured
# on a corpus by `prune fidelity` (docs/precisions.md).
INT8_TOLERANCE = 0.15
FP16_TOLERANCE = 0.02


def compare(
    reference: Callable[[dict], tuple],
    candidate: Callable[[dict], tuple],
    batches: list[dict[str, np.ndarray]],
) -> dict[str, float]:
    """Max |diff| of rerank scores and of valid sentence probabilities over `batches`."""
    max_prob = max_rerank = 0.0
    for feed in batches:
        r_ref, p_ref = reference(feed)
        r_got, p_got = candidate(feed)
        if p_got.shape[1:] != p_ref.shape[1:] and p_got.ndim == 2 and p_got.shape[1] > p_ref.shape[1]:
            # a graph with a column per token position (the GPU graph): the rest hold no sentence
            extra, p_got = p_got[:, p_ref.shape[1] :], p_got[:, : p_ref.shape[1]]
            if np.abs(extra).max(initial=0.0) != 0.0:
                raise ExportError("the graph's sentence columns past the last sentence are not 0")
        if p_got.shape != p_ref.shape or r_got.shape != r_ref.shape:
            raise ExportError(f"shape mismatch: {p_got.shape} vs {p_ref.shape}")
        if not (np.isfinite(p_got).all() and np.isfinite(r_got).all()):
            raise ExportError("the graph produced NaN or inf")
        max_prob = max(max_prob, float(np.abs(p_got - p_ref).max(initial=0.0)))
        max_rerank = max(max_rerank, float(np.abs(r_got - r_ref).max(initial=0.0)))
    return {
        "max_abs_diff_sentence_probs": max_prob,
        "max_abs_diff_rerank_score": max_rerank,
        "batches": len(batches),
    }


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


@dataclass
class Parity:
    """Each graph of an export against PyTorch on the sample batches, in order; `batches`
    None: not verifying (every check passes). `reports`: what each check measured."""

    reference: Callable[[dict], tuple]
    batches: list[dict[str, np.ndarray]] | None
    log: Callable[[str], None]
    reports: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def against(cls, model: TorchModel, encoder: Encoder, verify: bool, log: Callable[[str], None]) -> Parity:
        """The checks against `model`'s PyTorch module on `encoder`'s sample batches (none
        when not `verify`)."""
        return cls(torch_runner(model.module, model.spec), sample_batches(encoder) if verify else None, log)

    def check(self, graph: Path, step: str, tol: float) -> None:
        """ExportError when `graph` (the export's `step`) disagrees with PyTorch by more than `tol`."""
        if self.batches is None:
            return
        self.log(f"checking the {step} graph against PyTorch ...")
        report = compare(self.reference, ort_runner(graph), self.batches)
        report.update(step=step, tolerance=tol)
        self.reports.append(report)
        worst = max(report["max_abs_diff_sentence_probs"], report["max_abs_diff_rerank_score"])
        if worst > tol:
            raise ExportError(
                f"the {step} graph disagrees with PyTorch: max |diff| {worst:.3g} "
                f"> tolerance {tol:g} ({report})"
            )
        self.log(
            f"parity OK ({step}): max |diff| probs {report['max_abs_diff_sentence_probs']:.2e}, "
            f"rerank {report['max_abs_diff_rerank_score']:.2e} over {report['batches']} batches"
        )
