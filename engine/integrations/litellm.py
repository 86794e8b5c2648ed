"""A LiteLLM proxy guardrail that prunes and compresses a chat call's context in place, through a
running `prune api`, before the proxy sends the call upstream (docs/integrations.md, "LiteLLM").

    guardrails:
      - guardrail_name: prune-engine
        litellm_params:
          guardrail: engine.integrations.litellm.PruneEngineGuardrail
          mode: pre_call
          default_on: true
          api_base: os.environ/PRUNE_ENGINE_URL
          prune_tool_results: true

Why a guardrail and not a plain callback: the proxy builds a guardrail from its config with the
settings beside it (`api_base` and `api_key` read from the environment by the proxy, the time
budget as LiteLLM's own `timeout`), names it on a model (`guardrails:` in a deployment's
`litellm_params`) or a request (`guardrails: [...]`), and runs it through its unified
`apply_guardrail` path, which hands every chat route's messages in OpenAI's shape and writes them
back: `/v1/chat/completions`, streamed or not, and Anthropic's `/v1/messages`. LiteLLM's per-key
and per-team guardrail lists are an enterprise feature; key and team metadata are not, so opt-in
per key and team is `prune_engine` in their metadata, read here (engine.integrations.chat_context).

Fail-open: the engine down, slower than the budget, or answering an error leaves the messages as
they came (the call goes on); a WARNING line on the `prune.litellm` logger says why, and so do the
response's headers (`x-prune-engine-*`, added by async_post_call_response_headers_hook).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx
import litellm
from litellm.integrations.custom_guardrail import CustomGuardrail
from litellm.types.guardrails import GuardrailEventHooks, LitellmParams

from engine.errors import InputError
from engine.integrations.chat_context import (
    METADATA_KEY,
    SETTING_NAMES,
    HookSettings,
    Plan,
    Target,
    plan,
    prompt_tokens,
    rewritten,
    text_at,
    texts_of,
)

#: the environment variables the engine's URL and API key are read from when the config has none
URL_ENV, KEY_ENV = "PRUNE_ENGINE_URL", "PRUNE_ENGINE_API_KEY"
#: seconds the engine's answers may take, all together, before the original messages go on
DEFAULT_TIMEOUT = 2.0
#: the response headers' prefix
HEADER = "x-prune-engine-"
#: calls whose outcome waits for their response headers, at most (the oldest forgotten past it)
OUTCOMES_KEPT = 10_000

log = logging.getLogger("prune.litellm")


class EngineError(Exception):
    """The engine did not answer, or answered an error."""


class EngineClient:
    """`/v1/prune` and `/v1/compress` of one `prune api`, over httpx on the running event loop."""

    def __init__(self, url: str, api_key: str | None, timeout: float):
        self.url, self.timeout = url.rstrip("/"), timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._loop: Any = None

    def client(self) -> httpx.AsyncClient:
        """The connection pool of the running event loop (a new one for another loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = httpx.AsyncClient(timeout=self.timeout, headers=self._headers), loop
        return self._client

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """The engine's JSON answer to `body` at `path`; EngineError when there is none."""
        try:
            r = await self.client().post(self.url + path, json=body)
        except httpx.TimeoutException:
            raise asyncio.TimeoutError from None  # past the budget, as the hook's own clock says it
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.url}{path} unreachable: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            try:
                message = r.json().get("error", "")
            except (ValueError, AttributeError):
                message = r.text[:200]
            raise EngineError(f"{self.url}{path} answered {r.status_code}: {message}")
        return r.json()

    async def prune(self, question: str, passages: list[str], options: dict[str, Any]) -> list[str]:
        """Each passage as `/v1/prune` leaves it (its compressed text where the options compress)."""
        answer = await self.post("/v1/prune", {"question": question, "passages": passages, **options})
        results = sorted(answer["results"], key=lambda r: r["index"])
        if [r["index"] for r in results] != list(range(len(passages))):
            raise EngineError(
                f"{self.url}/v1/prune answered {len(results)} results for {len(passages)} passages"
            )
        return [
            r["compressed_context"] if "compressed_context" in r else r["pruned_context"] for r in results
        ]

    async def compress(self, text: str, options: dict[str, Any]) -> str:
        """`text` as `/v1/compress` compresses it."""
        return (await self.post("/v1/compress", {"context": text, **options}))["compressed_prompt"]


@dataclass(frozen=True)
class Outcome:
    """What the hook did to one call, as its response headers say it."""

    ms: float
    skipped: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    pruned: int = 0
    compressed: int = 0

    def headers(self) -> dict[str, str]:
        """`x-prune-engine-*`: the time spent and the tokens before and after, or why it was skipped."""
        out = {HEADER + "ms": f"{self.ms:.1f}"}
        if self.skipped is not None:
            out[HEADER + "skipped"] = " ".join(self.skipped.split())[:300].encode("ascii", "replace").decode()
            return out
        out.update(
            {
                HEADER + "tokens-before": str(self.tokens_before),
                HEADER + "tokens-after": str(self.tokens_after),
                HEADER + "pruned": str(self.pruned),
                HEADER + "compressed": str(self.compressed),
            }
        )
        return out


#: the guardrail's own settings beside the call settings: where the engine is, and the budget
ADMIN_SETTINGS = ("api_base", "api_key", "timeout")


class PruneEngineGuardrail(CustomGuardrail):
    """LiteLLM's proxy guardrail (mode pre_call): prune a chat call's retrieved context against its
    question and compress the messages the settings name, through `prune api`; fail-open."""

    def __init__(
        self,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ):
        own = {name: kwargs.pop(name) for name in list(kwargs) if name in SETTING_NAMES}
        unknown = sorted(set(kwargs) - set(LitellmParams.model_fields) - {"guardrail_name", "event_hook"})
        if unknown:
            raise ValueError(
                f"prune-engine guardrail: unknown setting {', '.join(map(repr, unknown))}; its settings are "
                f"{', '.join(ADMIN_SETTINGS + SETTING_NAMES)} (docs/integrations.md)"
            )
        url = api_base or os.environ.get(URL_ENV) or ""
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"prune-engine guardrail: api_base must be the engine's URL (http://host:port, `prune api`), "
                f"from the config or {URL_ENV}; got {url!r}"
            )
        if api_key == "None":  # what the proxy makes of `os.environ/NAME` when NAME is not set
            raise ValueError("prune-engine guardrail: api_key is 'None': is the variable it names set?")
        budget = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        if not budget > 0:
            raise ValueError(
                f"prune-engine guardrail: timeout must be a number of seconds over 0, got {timeout!r}"
            )
        try:
            self.settings = HookSettings().merged(own, "prune-engine guardrail config", turns_on=False)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        kwargs.setdefault("supported_event_hooks", [GuardrailEventHooks.pre_call])
        super().__init__(timeout=budget, **kwargs)
        self.budget = budget
        self.engine = EngineClient(url, api_key or os.environ.get(KEY_ENV) or None, budget)
        self._outcomes: collections.OrderedDict[str, Outcome] = collections.OrderedDict()

    # ----------------------------------------------------------------------- the settings of a call

    def settings_for(self, data: dict[str, Any]) -> HookSettings:
        """The call's settings: the config's, on where the call names this guardrail (its model's or
        its own `guardrails`), then the team's, the key's and the request's `prune_engine` layers."""
        settings = self.settings
        if self._guardrail_is_in_requested_guardrails(self.get_guardrail_from_metadata(data)):
            settings = replace(settings, enabled=True)
        for where, layer in _layers(data):
            settings = settings.merged(layer, where)
        return settings

    # ----------------------------------------------------------------------- the hook

    async def apply_guardrail(
        self, inputs: Any, request_data: dict, input_type: str, logging_obj: Any = None
    ) -> Any:
        """The request's messages pruned and compressed in place, or as they came (fail-open)."""
        if input_type != "request":
            return inputs
        t0 = time.perf_counter()
        messages = inputs.get("structured_messages")
        try:
            outcome, new = await self._rewrite(messages, request_data, t0)
        except Exception as exc:  # fail-open whatever went wrong: the call goes on as it came
            log.warning(
                "prune-engine: skipped (%s: %s); the original messages go upstream", type(exc).__name__, exc
            )
            outcome, new = Outcome(_ms(t0), f"hook error: {type(exc).__name__}"), None
        self._remember(request_data, outcome)
        return inputs if new is None else {**inputs, "structured_messages": new}

    async def _rewrite(self, messages: Any, data: dict, t0: float) -> tuple[Outcome | None, list | None]:
        try:
            settings = self.settings_for(data)
        except InputError as exc:
            log.warning("prune-engine: skipped, bad settings (%s); the original messages go upstream", exc)
            return Outcome(_ms(t0), f"bad settings: {exc}"), None
        if not settings.enabled:
            return None, None  # not opted in: nothing done, nothing to report
        if not isinstance(messages, list) or not messages:
            return Outcome(_ms(t0), "no chat messages"), None
        work = plan(messages, settings)
        if work.empty:
            return Outcome(_ms(t0), "; ".join(["nothing to prune or compress", *work.notes])), None
        try:
            changes = await asyncio.wait_for(self._ask(work, messages, settings), self.budget)
        except asyncio.TimeoutError:
            why = f"the engine did not answer within the {self.budget:g} s budget"
        except EngineError as exc:
            why = str(exc)
        else:
            new = rewritten(messages, changes)
            before = prompt_tokens(messages, count_tokens)
            after = before + _changed_tokens(new, changes) - _changed_tokens(messages, changes)
            outcome = Outcome(_ms(t0), None, before, after, len(work.prune), len(work.compress))
            log.info(
                "prune-engine: %d passages pruned, %d texts compressed: %d -> %d tokens in %.0f ms",
                outcome.pruned,
                outcome.compressed,
                before,
                after,
                outcome.ms,
            )
            return outcome, new
        log.warning("prune-engine: skipped (%s); the original messages go upstream", why)
        return Outcome(_ms(t0), why), None

    async def _ask(self, work: Plan, messages: list, settings: HookSettings) -> dict[Target, str]:
        """Every text's new text: one /v1/prune call for the passages, a /v1/compress call per text,
        all at once."""
        calls = []
        if work.prune:
            passages = [text_at(messages, t) for t in work.prune]
            calls.append(self.engine.prune(work.question, passages, settings.prune_options))
        options = settings.compress_body()
        calls += [self.engine.compress(text_at(messages, t), options) for t in work.compress]
        answers = await asyncio.gather(*calls)
        pruned = answers.pop(0) if work.prune else []
        return {**dict(zip(work.prune, pruned)), **dict(zip(work.compress, answers))}

    # ----------------------------------------------------------------------- the headers

    def _remember(self, data: dict, outcome: Outcome | None) -> None:
        call = data.get("litellm_call_id")
        if not call or outcome is None:
            return
        self._outcomes[call] = outcome
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, Any] | None = None,
    ) -> dict[str, str] | None:
        """The call's `x-prune-engine-*` headers, where the hook ran on it."""
        outcome = self._outcomes.pop(data.get("litellm_call_id") or "", None)
        return None if outcome is None else outcome.headers()


def _layers(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """The call's `prune_engine` layers, in order: the team's metadata, the key's (as the proxy put
    them in the request's metadata), then the request's own."""
    buckets = [b for b in (data.get("metadata"), data.get("litellm_metadata")) if isinstance(b, dict)]
    out = []
    for where, name in (
        ("team metadata", "user_api_key_team_metadata"),
        ("key metadata", "user_api_key_metadata"),
    ):
        layer = next((b[name][METADATA_KEY] for b in buckets if METADATA_KEY in (b.get(name) or {})), None)
        if layer is not None:
            out.append((where, layer))
    request = next((b[METADATA_KEY] for b in buckets if METADATA_KEY in b), None)
    if request is not None:
        out.append(("request metadata", request))
    return out


def _changed_tokens(messages: list, changes: dict[Target, str]) -> int:
    """The tokens of the texts `changes` touch (a whole message text or part each: the other texts
    are the same before and after, and counting them twice is the proxy's loop's time)."""
    touched = {(t.message, t.part) for t in changes}
    return sum(
        count_tokens(text)
        for i in {m for m, _ in touched}
        for part, text in texts_of(messages[i])
        if (i, part) in touched
    )


def count_tokens(text: str) -> int:
    """`text`'s tokens as LiteLLM counts a prompt by default (tiktoken's cl100k_base, bundled)."""
    return litellm.token_counter(text=text)


def _ms(t0: float) -> float:
    return 1000 * (time.perf_counter() - t0)


__all__ = ["PruneEngineGuardrail", "EngineClient", "EngineError", "Outcome"]
