"""What the LangChain and LlamaIndex adapters share, both being pydantic models: the
`pruner` field, the engine it opens, the old option names, and the option fields made
from engine.pipeline.inputs.CallOptions (`top_k` named `top_n`, as both frameworks' rerankers say)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, create_model, model_validator

from engine.integrations.adapter import (TOP_N, Adapter, PruneOptions, adapter_fields, options_of, renamed,
                                        resolve_pruner)


class PrunerModel(Adapter, BaseModel):
    """The `pruner` an adapter is given, opened once when the adapter is made, and the
    options it holds as fields."""

    pruner: Any = Field(description="a Pruner (in-process or Pruner.connect), an HttpPruner, the HTTP API's "
                                    "URL, an exported folder, or 'default'")
    _engine: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return renamed(data, TOP_N, cls.__name__)

    def model_post_init(self, __context: Any) -> None:
        """Open the pruner."""
        self._engine = resolve_pruner(self.pruner)

    def _options(self) -> PruneOptions:
        """The options the adapter's fields hold (`top_k` named `top_n`)."""
        return options_of(self, TOP_N)


def with_options(base: type, name: str, doc: str) -> type:
    """`base` (a PrunerModel and its framework's class) with every option as a field."""
    return create_model(name, __base__=base, __module__=base.__module__, __doc__=doc, **adapter_fields(TOP_N))
