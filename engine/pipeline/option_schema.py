"""The call options as each surface shows them: what each means (its help), its type and
choices, the pydantic fields the HTTP request and the adapters are made of, and what a
misspelt name is told. The options themselves are `engine.pipeline.inputs.CallOptions`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Literal

from engine.pipeline.inputs import OPTION_NAMES, SPLITTERS, TITLE_RULES, WINDOWS, CallOptions


def option_help(name: str) -> str:
    """What option `name` means (the one text the CLI, the HTTP schema and the docs use)."""
    return next(f.metadata["help"] for f in fields(CallOptions) if f.name == name)


def option_type(name: str) -> type:
    """The Python type an option takes when set: float, int, bool or str."""
    f = next(f for f in fields(CallOptions) if f.name == name)
    return {
        "reorder": bool,
        "top_k": int,
        "title": str,
        "windows": str,
        "splitter": str,
        "budget_tokens": int,
        "budget_tokenizer": str,
        "compress_target_token": int,
    }.get(f.name, float)


def option_choices(name: str) -> tuple[str, ...] | None:
    """The values a text option takes (title, windows, splitter), None for the others."""
    return {"title": TITLE_RULES, "windows": WINDOWS, "splitter": SPLITTERS}.get(name)


def option_fields(rename: dict[str, str] | None = None) -> dict[str, tuple[Any, Any]]:
    """Every option as a pydantic field definition (`create_model`'s `(type, Field)`): its
    type (a Literal of its choices), None (reorder: false) the default, its help the
    description. `rename` gives an option a framework's own name (`{"top_k": "top_n"}`).
    The HTTP request model and the LangChain and LlamaIndex adapters are made of these."""
    from pydantic import Field

    out: dict[str, tuple[Any, Any]] = {}
    for name in OPTION_NAMES:
        choices = option_choices(name)
        kind = Literal[choices] if choices else option_type(name)  # type: ignore[valid-type]
        spec = (
            (bool, Field(False, description=option_help(name)))
            if name == "reorder"
            else (kind | None, Field(None, description=option_help(name)))
        )
        out[(rename or {}).get(name, name)] = spec
    return out


def unknown_name(name: str, known: Sequence[str], what: str = "field") -> str:
    """What a misspelt `name` is told: that it is unknown, the nearest of `known` if one is
    close ("did you mean threshold?"), else every known one."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"unknown {what} {name!r}; " + (
        f"did you mean {near[0]!r}?" if near else f"the {what}s are {', '.join(known)}"
    )
