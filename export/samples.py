"""The sample inputs every export is checked on: a question and passages that exercise
short, long (several blocks) and CJK text, as the engine's own encoder makes them."""

from __future__ import annotations

import numpy as np

from engine.pipeline.encode import BatchingConfig, Encoder

SAMPLE_QUESTION = "What goes on the bottom of the pie, and who wrote about it first?"
SAMPLE_PASSAGES = [
    "Shepherd's pie. In early cookery books, the dish was a means of using leftover roasted meat. "
    "The pie dish was lined on the sides and bottom with mashed potato.",
    "Paris is the capital of France.",
    " ".join(
        f"Sentence number {i} talks about the weather in 2020 and the price of 3.50 dollars."
        for i in range(60)
    ),
    "北京是中国的首都。上海是一个大城市。The museum opened a new exhibition about ancient Egypt.",
]


def sample_batches(encoder: Encoder, batch_sizes=(1, 3)) -> list[dict[str, np.ndarray]]:
    """Realistic inputs from the engine's own encoder: short, long (multi-block), CJK."""
    from engine.pipeline.encode import collate, plan
    from engine.pipeline.text import split_sentences

    q = encoder.question_ids(SAMPLE_QUESTION)
    blocks = []
    for i, p in enumerate(SAMPLE_PASSAGES):
        spans = split_sentences(p)
        blocks += encoder.blocks(q, i, encoder.tokenize([p[s:e] for s, e in spans]))
    out = []
    for size in batch_sizes:
        cfg = BatchingConfig(max_batch_tokens=10**9, max_batch_size=size)
        for length, idx in plan([len(b) for b in blocks], cfg, encoder.spec.max_length):
            batch = collate(blocks, idx, length, encoder.spec.pad_id)
            out.append(batch.inputs(encoder.spec.input_names))
    return out
