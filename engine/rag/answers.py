"""What the retrieval pipeline returns: `prune ask`'s answer and its passages, `prune index`'s report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.pipeline.results import PruneResult


@dataclass
class AskResult:
    """What `prune ask` retrieved and kept for one question."""

    id: str  # the source document's id
    chunk: int  # chunk number within the document
    start: int  # character span of the chunk in the document
    end: int
    text: str  # the chunk, untouched
    metadata: dict[str, Any]  # the document's other fields
    retrieval_rank: int  # 1-based rank from Milvus
    retrieval_score: float  # Milvus's score (RRF for hybrid, cosine for dense, BM25)
    reranking_score: float | None
    pruned_context: str
    highlighted: str  # the chunk with kept sentences between the tags
    result: PruneResult = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        d = {k: v for k, v in asdict(self).items() if k != "result"}
        d["sentences"] = [asdict(s) for s in self.result.sentences]
        d["compression_rate"] = self.result.compression_rate
        return d


@dataclass
class Answer:
    """One retrieved passage: its id, score, text and what was kept."""

    question: str
    mode: str
    candidates: int
    reranked: bool
    results: list[AskResult]
    timings_ms: dict[str, float]

    def context(self) -> str:
        """The pruned passages, numbered with their sources, ready for an LLM prompt
        (passages with nothing kept are left out)."""
        parts = [
            f"[{i}] (source: {r.id}#{r.chunk})\n{r.pruned_context}"
            for i, r in enumerate((r for r in self.results if r.pruned_context), 1)
        ]
        return "\n\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "question": self.question,
            "mode": self.mode,
            "candidates": self.candidates,
            "reranked": self.reranked,
            "results": [r.to_dict() for r in self.results],
            "context": self.context(),
            "timings_ms": self.timings_ms,
        }


@dataclass
class IndexReport:
    """What `prune index` wrote: documents, chunks, time."""

    documents: int
    chunks: int
    seconds: float
    embed_seconds: float
    collection: str
    db: str
