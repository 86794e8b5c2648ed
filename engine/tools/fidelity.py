"""`prune fidelity`'s report: the fidelity of a precision against the fp32 PyTorch
reference, as text and as JSON. The comparison and the gate are the engine's
(engine.measure.fidelity, which `prune export --precision auto` gates with); they are offered here
beside the report.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.measure.fidelity import (  # noqa: F401 (re-exported: prune fidelity's and the studies' names)
    GATE,
    fidelity_report,
    gate,
    load_docs,
    measure,
    rankdata,
    run_model,
    spearman,
)


def format_report(name: str, rep: dict[str, Any]) -> str:
    """The report as text."""
    agree = " | ".join(f"{100 * v:.2f}%" for v in rep["decision_agreement"].values())
    heads = " | ".join(f"agree@{t}" for t in rep["decision_agreement"])
    return "\n".join([
        f"| model | {heads} | max abs dp | mean abs dp | rerank max err | rerank Spearman | pruned text changed |",
        "|---|" + "---|" * (len(rep["decision_agreement"]) + 5),
        f"| {name} | {agree} | {rep['max_abs_delta_prob']:.2e} | {rep['mean_abs_delta_prob']:.2e} | "
        f"{rep['rerank_max_abs_error']:.2e} | {rep['rerank_spearman']:.5f} | "
        f"{100 * rep['pruned_text_changed_share']:.1f}% |",
        f"({rep['documents']} documents, {rep['sentences']} sentences)",
    ])


def save(rep: dict[str, Any], path: str | Path) -> None:
    """The report as JSON at `path`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rep, indent=2) + "\n")
