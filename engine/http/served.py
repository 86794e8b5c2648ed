"""What the HTTP API serves, typed by the jobs it offers (TEI's ModelType picks the routes;
infinity's capabilities refuse what a model does not do): a pruner (the pruning job: TEI's and
Cohere's rerank, /v1/prune, OpenSearch's highlighter, Milvus's model service), an LLMLingua-2
compressor (the compressing job: /v1/compress), or a pruner with a compressor beside it (`prune api
--compressor`: both jobs at one address). Each route is registered with its job (engine.http.app);
a route whose job the model does not offer answers 404 saying why (`Served.refusal`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from engine.compressor import Compressor
from engine.http.compress_api import PATH as COMPRESS_PATH
from engine.protocol import CompressorProtocol, PrunerProtocol
from engine.pruner import Pruner


class Job(Enum):
    """A job a served model offers, and so the routes it serves."""

    PRUNE = "prune"  # reranking, pruning and highlighting passages for a question
    COMPRESS = "compress"  # LLMLingua-2's compression of a prompt


@dataclass(frozen=True)
class Served:
    """The model the API serves: its pruner, its compressor, or both (at least one)."""

    pruner: PrunerProtocol | None = None
    compressor: CompressorProtocol | None = None

    def __post_init__(self) -> None:
        if self.pruner is None and self.compressor is None:
            raise ValueError("the API serves a pruner, a compressor, or both")

    @classmethod
    def of(cls, model: PrunerProtocol | CompressorProtocol) -> Served:
        """`model` served: a compressor (what engine.protocol.CompressorProtocol says one offers),
        or a pruner and the compressor beside it (an in-process Pruner's `compressor`)."""
        if isinstance(model, CompressorProtocol):
            return cls(compressor=model)
        return cls(pruner=model, compressor=model.compressor if isinstance(model, Pruner) else None)

    @property
    def jobs(self) -> frozenset[Job]:
        """The jobs offered."""
        return frozenset(
            job
            for job, model in ((Job.PRUNE, self.pruner), (Job.COMPRESS, self.compressor))
            if model is not None
        )

    def refusal(self, job: Job, path: str, name: str) -> str:
        """Why `path`, a route of `job` (not offered), is refused for the model called `name`."""
        if self.pruner is None:
            return (
                f"the loaded model ({name}) is an LLMLingua-2 compressor: it serves POST {COMPRESS_PATH}, "
                f"not {path} (a pruning model does: prune api --model PRUNING_MODEL)"
            )
        return (
            f"the loaded model ({name}) is a pruning model (family {self.pruner.family.name}): {path} needs "
            "an LLMLingua-2 compressor (prune api --model LLMLINGUA2_CHECKPOINT_OR_EXPORT, or --compressor "
            "LLMLINGUA2_DIR beside this model)"
        )

    def probe(self) -> Any:
        """The health inference: a tiny call of the pruner, else of the compressor."""
        if self.pruner is not None:
            return self.pruner.prune("Is the engine up?", ["The engine is up."])
        assert self.compressor is not None
        return self.compressor.compress("The engine is up and answers.", rate=0.5)

    def reports(self) -> dict[str, dict]:
        """The device figures (the GPU graph's) by role: "model", the model served (the pruner,
        else the compressor), and "compressor", the one beside a pruner; where an in-process core
        has them (a remote model has none here)."""
        roles = {
            "model": self.pruner or self.compressor,
            "compressor": self.compressor if self.pruner else None,
        }
        out = {}
        for role, model in roles.items():
            core = (
                model.backend
                if isinstance(model, Pruner)
                else model.core
                if isinstance(model, Compressor)
                else None
            )
            figures = core.report() if core is not None else None
            if figures:
                out[role] = figures
        return out
