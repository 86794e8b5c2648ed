"""What the measuring tools ask of a pruner beyond its API: a call's blocks and padded batches on
given sentence spans, the model's own scores, a workload's batches. `prune bench`, `prune eval`,
`prune fidelity`, `prune export --precision auto` (engine.machine.timing times the batches) and
NNCF's calibration (export/ov_int8.py) use them; nothing a server runs does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.cancellation import infer_batches
from engine.pipeline import text as textmod
from engine.pipeline.decide import Scored
from engine.pipeline.encode import Block, ModelBatch
from engine.pipeline.inputs import CallOptions
from engine.pruner import Pruner, block_outputs


def call_blocks(
    pruner: Pruner,
    question: str,
    passages: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    windows: str | None = None,
) -> list[Block]:
    """The blocks a call on these sentence spans is cut into, the way `windows` says (the
    family's default if None): each block's tokens and sentence slots, before batching."""
    return pruner._prepare(
        question,
        list(passages),
        CallOptions.of(windows=windows, lexical_weight=0.0),
        [list(sp) for sp in spans],
        batched=False,
    ).blocks


def call_batches(
    pruner: Pruner,
    question: str,
    passages: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    windows: str | None = None,
) -> list[ModelBatch]:
    """The padded batches a call on these sentence spans runs in, cut the way `windows` says
    (the family's default if None): what `prune bench`, `--precision auto` and NNCF's
    calibration time or feed."""
    call = pruner._prepare(
        question,
        list(passages),
        CallOptions.of(windows=windows, lexical_weight=0.0),
        [list(sp) for sp in spans],
    )
    return call.batches


def model_scores(
    pruner: Pruner,
    question: str,
    passages: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    windows: str | None = None,
) -> list[Scored]:
    """The model's own scores per passage on the given sentence spans (no lexical fusion, no
    decision but the token windows' own at the family's defaults): what `prune eval` and
    `prune fidelity` measure. The same route as `prune`: `prepare`, the model, the scores."""
    call = pruner.prepare(question, passages, sentences=spans, windows=windows, lexical_weight=0.0)
    outputs = infer_batches(pruner.backend, call.batches)
    return pruner._scores(call, block_outputs(call.blocks, call.batches, outputs))


def workload_batches(pruner: Pruner, queries: Any) -> list[ModelBatch]:
    """The padded batches the engine sends for a workload (one call per query, the engine's
    sentences): what `prune bench` and `--precision auto` time the model on."""
    out: list[ModelBatch] = []
    for q in queries:
        out += call_batches(pruner, q.question, q.passages, [textmod.split_sentences(p) for p in q.passages])
    return out


def windows_of(pruner: Pruner, windows: str | None) -> str:
    """The windowing a call that passes `windows` runs (None: the model's default)."""
    return pruner.spec.family.rules.resolve(CallOptions.of(windows=windows)).windows
