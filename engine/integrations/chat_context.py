"""What a gateway hook does to a chat request's messages, apart from any gateway: which texts it
prunes against the turn's question and which it compresses, with which settings, and how the
engine's answers go back in place. `engine.integrations.litellm` runs it inside LiteLLM's proxy;
the messages are OpenAI's chat shape (`role`, and `content` a string or a list of parts whose
text parts are `{"type": "text", "text": ...}`), which LiteLLM hands every chat route in.

The rules (docs/integrations.md, "LiteLLM"):
- prune: each tool result (a `tool` message's text, with `prune_tool_results`) and each block
  between the context tags (`<context>...</context>` in a user or system message, with
  `prune_context_tags`) is a passage, pruned against the question in one `/v1/prune` call;
- the question is the last user message's text, its context blocks left out; without one,
  nothing is pruned;
- compress: each text of a message whose role is in `compress_roles`, at least
  `compress_min_chars` long, is compressed alone by `/v1/compress`; a text that holds a pruned
  passage is not compressed too, and the last user message (the question) goes as written;
- settings come in layers, each a dict of the same names: the hook's config, then the team's
  metadata, the key's, and the request's (`prune_engine` in each), the later winning (the
  option dicts merged name by name); a layer present turns the hook on unless it says
  `enabled: false` (`true` and `false` stand for `{}` and `{"enabled": false}`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.errors import InputError
from engine.pipeline.option_schema import unknown_name
from engine.pipeline.inputs import CallOptions, check_compress_rate, check_compress_target_token
from engine.pipeline.lingua_decide import CompressOptions

#: the metadata key (request, key, team) that holds a layer of settings
METADATA_KEY = "prune_engine"


@dataclass(frozen=True)
class HookSettings:
    """One call's settings: whether the hook acts, what it prunes and compresses, and how."""

    enabled: bool = False
    prune_tool_results: bool = False
    prune_context_tags: bool = False
    context_tags: tuple[str, str] = ("<context>", "</context>")
    prune_min_chars: int = 0
    prune_options: dict[str, Any] = field(default_factory=dict)
    compress_roles: tuple[str, ...] = ()
    compress_min_chars: int = 500
    compress_rate: float | None = None
    compress_target_token: int | None = None
    compress_options: dict[str, Any] = field(default_factory=dict)

    def merged(self, layer: Any, where: str, turns_on: bool = True) -> HookSettings:
        """These settings with `layer` over them (a dict of setting names, or True/False), checked:
        a bad name or value is an InputError that says `where` it came from. A layer present turns
        the hook on unless it says otherwise (`turns_on`: the hook's config does not)."""
        if isinstance(layer, bool):
            layer = {} if layer else {"enabled": False}
        if not isinstance(layer, dict):
            raise InputError(f"{where}: {METADATA_KEY} must be an object of settings, got {layer!r}")
        changes = {name: _setting(name, value, where) for name, value in layer.items()}
        if turns_on:
            changes = {"enabled": True, **changes}
        for name in ("prune_options", "compress_options"):
            if name in changes:
                changes[name] = {**getattr(self, name), **changes[name]}
        out = replace(self, **changes)
        out.check(where)
        return out

    def check(self, where: str) -> None:
        """An InputError (saying `where`) when the options are not the engine's."""
        placed = sorted({"top_k", "reorder"} & set(self.prune_options))
        if placed:
            raise InputError(
                f"{where}: prune_options {', '.join(placed)}: they rank and drop passages, and the hook "
                "keeps each passage in its place (a tool result, a context block)"
            )
        try:
            CallOptions.of(**self.prune_options)
            CompressOptions.of(**self.compress_body())
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None

    def compress_body(self) -> dict[str, Any]:
        """`/v1/compress`'s options for one text (all but `context`)."""
        body = dict(self.compress_options)
        if self.compress_rate is not None:
            body["rate"] = self.compress_rate
        if self.compress_target_token is not None:
            body["target_token"] = self.compress_target_token
        return body

    @property
    def acts(self) -> bool:
        """Whether these settings ask for anything at all."""
        return self.prune_tool_results or self.prune_context_tags or bool(self.compress_roles)


#: each setting's kind, as a layer may give it
_KINDS: dict[str, type] = {
    "enabled": bool,
    "prune_tool_results": bool,
    "prune_context_tags": bool,
    "context_tags": tuple,
    "prune_min_chars": int,
    "prune_options": dict,
    "compress_roles": tuple,
    "compress_min_chars": int,
    "compress_rate": float,
    "compress_target_token": int,
    "compress_options": dict,
}
SETTING_NAMES = tuple(f.name for f in fields(HookSettings))


def _setting(name: str, value: Any, where: str) -> Any:
    """A layer's setting `name`, checked and in its kind."""
    if name not in _KINDS:
        raise InputError(f"{where}: {unknown_name(name, SETTING_NAMES, 'setting')}")
    if name in _CHECKS:  # the same words as /v1/prune's compress_rate and compress_target_token
        try:
            return _CHECKS[name](value)  # None: unset (the engine's default, or the other one)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    kind = _KINDS[name]
    bad = InputError(f"{where}: {name} must be {_WORDS[kind]}, got {value!r}")
    if kind is bool:
        if not isinstance(value, bool):
            raise bad
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad
    elif kind is dict:
        if not isinstance(value, dict) or any(k in ("context", "question", "passages") for k in value):
            raise bad
    elif (
        isinstance(value, str)
        or not isinstance(value, (list, tuple))
        or not all(isinstance(v, str) for v in value)
    ):
        raise bad
    elif name == "context_tags" and (len(value) != 2 or not all(value)):
        raise bad
    return tuple(value) if kind is tuple else value


_CHECKS = {"compress_rate": check_compress_rate, "compress_target_token": check_compress_target_token}
_WORDS = {
    bool: "true or false",
    int: "a whole number, 0 or more",
    dict: "an object of the engine's options (without the texts)",
    tuple: "a list of strings (context_tags: the opening and the closing tag)",
}


# --------------------------------------------------------------------------- the texts


@dataclass(frozen=True)
class Target:
    """A stretch of one message's text that the engine rewrites: message `message`, its content
    string (`part` None) or text part `part`, characters [start, end)."""

    message: int
    part: int | None
    start: int
    end: int


def texts_of(message: Any) -> list[tuple[int | None, str]]:
    """A message's texts: (None, its content) for a string, (i, text) for each text part."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [(None, content)]
    if isinstance(content, list):
        return [
            (i, p["text"])
            for i, p in enumerate(content)
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
    return []


def text_at(messages: Sequence[Any], t: Target) -> str:
    """The text `t` points at."""
    text = dict(texts_of(messages[t.message]))[t.part]
    return text[t.start : t.end]


def blocks(text: str, tags: tuple[str, str]) -> list[tuple[int, int]]:
    """The [start, end) spans between each opening and closing tag of `text` (an unclosed tag
    opens nothing)."""
    open_tag, close_tag = tags
    out, at = [], 0
    while (start := text.find(open_tag, at)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        out.append((start + len(open_tag), end))
        at = end + len(close_tag)
    return out


def last_user(messages: Sequence[Any]) -> int | None:
    """The index of the last user message, if any."""
    return next((i for i in range(len(messages) - 1, -1, -1) if _role(messages[i]) == "user"), None)


def question_of(messages: Sequence[Any], settings: HookSettings) -> str:
    """The turn's question: the last user message's text, its context blocks left out."""
    i = last_user(messages)
    if i is None:
        return ""
    pieces = []
    for _, text in texts_of(messages[i]):
        at = 0
        spans = blocks(text, settings.context_tags) if settings.prune_context_tags else []
        open_len, close_len = (len(t) for t in settings.context_tags)
        for start, end in spans:
            pieces.append(text[at : start - open_len])
            at = end + close_len
        pieces.append(text[at:])
    return " ".join(" ".join(pieces).split())


def _role(message: Any) -> str:
    return str(message.get("role") or "").lower() if isinstance(message, dict) else ""


@dataclass
class Plan:
    """What one call sends the engine: the question, the passages to prune, the texts to compress
    (each a Target in the messages), and why something asked for was left alone."""

    question: str = ""
    prune: list[Target] = field(default_factory=list)
    compress: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """Whether there is nothing to send."""
        return not self.prune and not self.compress


def plan(messages: Sequence[Any], settings: HookSettings) -> Plan:
    """The passages `settings` prune and the texts they compress in `messages`."""
    out = Plan(question=question_of(messages, settings))
    held: set[tuple[int, int | None]] = set()  # texts that hold a passage: not compressed too
    for i, message in enumerate(messages):
        role = _role(message)
        for part, text in texts_of(message):
            spans: list[tuple[int, int]] = []
            if settings.prune_tool_results and role == "tool":
                spans = [(0, len(text))]
            elif settings.prune_context_tags and role in ("user", "system"):
                spans = blocks(text, settings.context_tags)
            spans = [(a, b) for a, b in spans if text[a:b].strip() and b - a >= settings.prune_min_chars]
            if spans:
                held.add((i, part))
                out.prune += [Target(i, part, a, b) for a, b in spans]
    if out.prune and not out.question:
        out.notes.append("no question (no user message with text) to prune against")
        held, out.prune = set(), []
    question_at = last_user(messages)
    for i, message in enumerate(messages):
        if _role(message) not in settings.compress_roles or i == question_at:
            continue
        for part, text in texts_of(message):
            if (i, part) not in held and text.strip() and len(text) >= settings.compress_min_chars:
                out.compress.append(Target(i, part, 0, len(text)))
    return out


def rewritten(messages: Sequence[Any], changes: dict[Target, str]) -> list[Any]:
    """`messages` with each target's text replaced by its new text: the messages changed are
    copies, the others the same objects; the input is not changed."""
    out = list(messages)
    by_text: dict[tuple[int, int | None], list[tuple[Target, str]]] = {}
    for t, new in changes.items():
        by_text.setdefault((t.message, t.part), []).append((t, new))
    for (i, part), edits in by_text.items():
        if out[i] is messages[i]:
            out[i] = copy.deepcopy(messages[i])
        text = dict(texts_of(out[i]))[part]
        for t, new in sorted(edits, key=lambda e: -e[0].start):
            text = text[: t.start] + new + text[t.end :]
        if part is None:
            out[i]["content"] = text
        else:
            out[i]["content"][part]["text"] = text
    return out


def prompt_tokens(messages: Sequence[Any], count: Callable[[str], int]) -> int:
    """The tokens of every text of `messages`, by `count`."""
    return sum(count(text) for m in messages for _, text in texts_of(m))
