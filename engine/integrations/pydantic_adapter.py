"""What the LangChain and LlamaIndex adapters share, both being pydantic models: the
`pruner` field, the engine it opens, and the option fields made from
engine.pipeline.inputs.CallOptions (`top_k` named `top_n`, as both frameworks' rerankers say); an
option it does not have is an error naming the options it has, not ignored."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, create_model, model_validator

from engine.errors import InputError
from engine.integrations.adapter import (
    TOP_N,
    Adapter,
    PruneOptions,
    adapter_fields,
    options_of,
    resolve_pruner,
)


class PrunerModel(Adapter, BaseModel):
    """The `pruner` an adapter is given, opened once when the adapter is made, and the
    options it holds as fields."""

    pruner: Any = Field(
        description="a Pruner (in-process or Pruner.connect), an HttpPruner, the HTTP API's "
        "URL, an exported folder, or 'default'"
    )
    _engine: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(k for k in data if k not in cls.model_fields and not k.startswith("_"))
            for name in unknown:
                hint = (
                    f" (it is {TOP_N[name]} here, as the framework's rerankers name it)"
                    if name in TOP_N
                    else ""
                )
                raise InputError(
                    f"{cls.__name__} has no option {name!r}{hint}; its options: "
                    f"{', '.join(n for n in cls.model_fields if n != 'callback_manager')}"
                )
        return data

    def model_post_init(self, __context: Any) -> None:
        """Open the pruner."""
        self._engine = resolve_pruner(self.pruner)

    def _options(self) -> PruneOptions:
        """The options the adapter's fields hold (`top_k` named `top_n`)."""
        return options_of(self, TOP_N)


def with_options(base: type, name: str, doc: str) -> type:
    """`base` (a PrunerModel and its framework's class) with every option as a field."""
    return create_model(name, __base__=base, __module__=base.__module__, __doc__=doc, **adapter_fields(TOP_N))
