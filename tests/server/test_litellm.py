"""The LiteLLM guardrail (engine.integrations.litellm) inside a real LiteLLM proxy, started from
examples/litellm/config.yaml (included verbatim) by `litellm --config`, offline, on a free loopback
port, in front of an OpenAI-compatible stub upstream that records what it receives, with a real
`prune api --model PRUNER --compressor LINGUA` (the tests' tiny random-weight exports) as the engine:
what reaches the upstream is the engine's own answer for each text (a direct /v1/prune and
/v1/compress call on the same texts), streamed or not, through /v1/chat/completions and
Anthropic's /v1/messages; the original passes when the call is not opted in, when the engine
answers an error, is slower than the budget, or is stopped; the response headers say which. The
request, key and team metadata are docs/integrations.md's (keys and teams come from a custom auth
function: the proxy's own key and team metadata, without a database)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.utils import free_ports

#: LiteLLM offline: at import it fetches its model cost map and Anthropic's beta headers, with retries
#: what keeps LiteLLM off the network (docs/integrations.md says so)
OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True"}
# found, not imported: the proxy runs it in a process of its own, and its import takes seconds
if importlib.util.find_spec("litellm") is None:
    pytest.skip("needs the dev extra's litellm[proxy]", allow_module_level=True)

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "litellm" / "config.yaml"
PAGE = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
SECTION = PAGE[PAGE.index("## LiteLLM") :].split("\n## ", 1)[0]  # up to the page's next section
MASTER_KEY = "sk-master-test"
#: the engine's API key (prune api --api-key; the hook reads it from PRUNE_ENGINE_API_KEY): never logged
ENGINE_KEY = "engine-key-never-logged"
QUESTION = "Why did the council not repair the bridge?"
PASSAGES = [
    "The council met on Tuesday to talk about the old bridge. Most members wanted a new one. "
    "The budget was small. Paris is the capital of France.",
    "Rye bread is denser than wheat bread. Its sour flavour comes from a starter. The council met again.",
]
LONG = (
    "The engineer said that repairs would cost 2.5 million and last ten years, while a new bridge "
    "would cost eight million and last a century. Most members wanted the new one."
)


def _blocks(kind: str) -> list[str]:
    """The section's code blocks fenced as ```KIND (KIND "": a bare fence), in order."""
    out, lang, body = [], None, []
    for line in SECTION.splitlines():
        if line.startswith("```") and lang is None:
            lang, body = line[3:], []
        elif line == "```":
            out += ["\n".join(body) + "\n"] if lang == kind else []
            lang = None
        elif lang is not None:
            body.append(line)
    return out


#: the page's request body, key metadata and team metadata (in that order)
DOC_REQUEST, DOC_KEY, DOC_TEAM = (json.loads(b) for b in _blocks("json"))
#: the keys the custom auth knows: (key metadata, team metadata)
KEYS = {
    "sk-plain": ({}, {}),
    "sk-key": (DOC_KEY, {}),
    "sk-team": ({}, DOC_TEAM),
    "sk-team-key-off": ({"prune_engine": False}, DOC_TEAM),
}
AUTH = f'''"""The tests' keys, as the proxy's custom auth: each key's metadata and its team's."""
import json

from litellm.proxy._types import UserAPIKeyAuth

KEYS = json.loads({json.dumps(json.dumps(KEYS))})


async def user_api_key_auth(request, api_key):
    key, team = KEYS[api_key]
    return UserAPIKeyAuth(api_key=api_key, metadata=key, team_id="team" if team else None, team_metadata=team)
'''


class Recorder(ThreadingHTTPServer):
    """A stub HTTP server in a thread: an OpenAI-compatible upstream that records each body, or an
    engine that is slow (/slow) or failing (/error)."""

    def __init__(self):
        self.bodies: list[dict] = []
        super().__init__(("127.0.0.1", free_ports(1)[0]), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def last(self) -> dict:
        """The body of the last chat call."""
        return self.bodies[-1]

    def handle_error(self, request, client_address):
        """Quiet: the hook hangs up on the slow engine before it answers."""


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.startswith("/slow"):
            time.sleep(3)
            return self._json(200, {"results": []})
        if self.path.startswith("/error"):
            return self._json(503, {"error": "the engine failed", "error_type": "Backend"})
        self.server.bodies.append(body)
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            return self._json(200, _completion(body, {"message": message, "finish_reason": "stop"}))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for delta, end in (
            ({"role": "assistant", "content": "o"}, None),
            ({"content": "k"}, None),
            ({}, "stop"),
        ):
            chunk = _completion(body, {"delta": delta, "finish_reason": end}, "chat.completion.chunk")
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _completion(body: dict, choice: dict, kind: str = "chat.completion") -> dict:
    out = {
        "id": "c1",
        "object": kind,
        "created": 1,
        "model": body["model"],
        "choices": [{"index": 0, **choice}],
    }
    return (
        out if kind == "chat.completion.chunk" else {**out, "usage": {"prompt_tokens": 1, "total_tokens": 2}}
    )


def _doc_command(program: str) -> list[str]:
    """The page's command line that runs `program`, split as a shell splits it."""
    line = next(line for line in _blocks("")[0].splitlines() if f" {program} " in f" {line} ")
    return shlex.split(line.removeprefix("$ "))


def _wait(url: str, proc: subprocess.Popen, what: str, log=None) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log() if log else ''}"[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up in 180 s")


@pytest.fixture(scope="module")
def upstream():
    server = Recorder()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def engine(exported, lingua_exports, tiktoken_offline):
    """The page's `prune api --model PRUNER --compressor LINGUA` on the tests' exports; (url, its
    start-up line, the process)."""
    (port,) = free_ports(1)
    models = {"PRUNER": str(exported["provence"]), "LINGUA": str(lingua_exports["xlm-roberta", "fp32"])}
    argv = [models.get(a, a) for a in _doc_command("prune")]
    argv[argv.index("--port") + 1] = str(port)
    argv += ["--api-key", ENGINE_KEY]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / argv[0]), *argv[1:]],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PRUNE_INTRA_OP_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    first = proc.stderr.readline()
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain the rest
    _wait(url + "/health", proc, "prune api")
    yield url, first, proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def proxy(engine, upstream, tmp_path_factory):
    """`litellm --config` as the page runs it, on a config that includes examples/litellm/config.yaml
    and adds a model without the hook, guardrails on a slow and a failing engine, and the custom auth
    of KEYS; (url, the file its output goes to)."""
    folder = tmp_path_factory.mktemp("litellm")
    (folder / "auth.py").write_text(AUTH)
    stub = Recorder()
    more = {
        "include": [str(EXAMPLE)],
        "model_list": [{"model_name": "chat", "litellm_params": {**_rag_params(), "model": "openai/chat"}}],
        "guardrails": [_guardrail(f"prune-engine-{kind}", f"{stub.url}/{kind}") for kind in ("slow", "error")]
        + [_guardrail("prune-engine-typo", stub.url, prune_tool_result=True)],
        "general_settings": {"custom_auth": "auth.user_api_key_auth"},
    }
    (folder / "config.yaml").write_text(json.dumps(more, indent=1))  # YAML reads JSON
    doc = _doc_command("litellm")
    assert doc[doc.index("--config") + 1] == "examples/litellm/config.yaml"
    env = dict(a.split("=", 1) for a in doc if re.match(r"^[A-Z_]+=", a))
    assert set(OFFLINE) <= set(env), "the page's command keeps LiteLLM offline"
    env.update(
        OFFLINE,
        PRUNE_ENGINE_URL=engine[0],
        PRUNE_ENGINE_API_KEY=ENGINE_KEY,
        UPSTREAM_API_BASE=upstream.url + "/v1",
        LITELLM_MASTER_KEY=MASTER_KEY,
    )
    (port,) = free_ports(1)
    out = folder / "proxy.log"
    with out.open("w") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "litellm"), "--config", str(folder / "config.yaml")]
            + ["--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=folder,
        )
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health/liveliness", proc, "the litellm proxy", lambda: out.read_text())
    yield url, out
    proc.terminate()
    proc.wait(timeout=30)
    stub.shutdown()


def _rag_params() -> dict:
    import yaml

    params = dict(yaml.safe_load(EXAMPLE.read_text())["model_list"][0]["litellm_params"])
    params.pop("guardrails")
    return params


def _guardrail(name: str, url: str, **more) -> dict:
    params = {"guardrail": "engine.integrations.litellm.PruneEngineGuardrail", "mode": "pre_call", **more}
    return {
        "guardrail_name": name,
        "litellm_params": {**params, "api_base": url, "timeout": 0.5, "prune_tool_results": True},
    }


def call(proxy, body: dict, key: str = "sk-plain", path: str = "/v1/chat/completions") -> tuple[dict, str]:
    """The proxy's answer to `body`: its headers (x-prune-engine-*) and its text."""
    req = urllib.request.Request(
        proxy[0] + path,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}", "x-api-key": key},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        headers = {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("x-prune-engine-")}
        return headers, r.read().decode()


def engine_call(engine, path: str, body: dict) -> dict:
    """The engine's own answer (a direct call)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ENGINE_KEY}"}
    req = urllib.request.Request(engine[0] + path, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def pruned(engine, passages: list[str], **options) -> list[str]:
    """Each passage as /v1/prune leaves it against QUESTION."""
    body = {"question": QUESTION, "passages": passages, **options}
    return [r["pruned_context"] for r in engine_call(engine, "/v1/prune", body)["results"]]


def compressed(engine, text: str, **options) -> str:
    return engine_call(engine, "/v1/compress", {"context": text, **options})["compressed_prompt"]


def tool_turn(*passages: str) -> list[dict]:
    """An agentic RAG turn: the question, the assistant's tool calls, their results."""
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": "{}"}}
        for i in range(len(passages))
    ]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": p} for i, p in enumerate(passages)]
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
    ]


def contents(body: dict, role: str) -> list:
    return [m.get("content") for m in body["messages"] if m["role"] == role]


#: the request option the tests prune with (the tiny model keeps every sentence at its default 0.1)
THRESHOLD = {"prune_engine": {"prune_options": {"threshold": 0.3}}}


# --------------------------------------------------------------------------- the example: every call to rag


def test_the_page_shows_the_example_and_one_engine_serves_both_jobs(engine):
    assert _blocks("yaml") == [EXAMPLE.read_text()]
    assert DOC_REQUEST["messages"][0]["content"] == QUESTION and DOC_REQUEST["model"] == "rag"
    _, first, _ = engine
    assert re.search(
        r"^prune api: provence .*; compressor xlm-roberta-fp32 \(LLMLingua-2 .*\) for compress_rate "
        r"/ compress_target_token and POST /v1/compress",
        first,
    )
    req = urllib.request.Request(engine[0] + "/info", headers={"Authorization": f"Bearer {ENGINE_KEY}"})
    info = json.loads(urllib.request.urlopen(req).read())
    assert info["family"] == "provence" and info["compressor"]["routes"] == ["/v1/compress"]
    assert compressed(engine, LONG, rate=0.5) != LONG


def test_the_pages_request_reaches_the_upstream_with_its_tool_result_pruned_by_the_engine(
    proxy, engine, upstream, monkeypatch
):
    headers, text = call(proxy, DOC_REQUEST)
    assert json.loads(text)["choices"][0]["message"]["content"] == "ok"
    sent = upstream.last()
    original = contents(DOC_REQUEST, "tool")
    assert (
        original == PASSAGES and contents(sent, "tool") == pruned(engine, original, threshold=0.3) != original
    )
    assert (
        contents(sent, "user") == [QUESTION]
        and sent["messages"][1]["tool_calls"] == DOC_REQUEST["messages"][1]["tool_calls"]
    )
    assert headers["x-prune-engine-pruned"] == "2" and headers["x-prune-engine-compressed"] == "0"
    assert int(headers["x-prune-engine-tokens-after"]) < int(headers["x-prune-engine-tokens-before"])
    assert float(headers["x-prune-engine-ms"]) > 0 and "x-prune-engine-skipped" not in headers
    # the headers' counts are the whole prompt's, before and as the upstream got it (LiteLLM's counter)
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    from engine.integrations.chat_context import prompt_tokens
    from engine.integrations.litellm import count_tokens

    assert int(headers["x-prune-engine-tokens-before"]) == prompt_tokens(
        DOC_REQUEST["messages"], count_tokens
    )
    assert int(headers["x-prune-engine-tokens-after"]) == prompt_tokens(sent["messages"], count_tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_tool_result_of_a_rag_call_is_pruned_against_the_question(proxy, engine, upstream, stream):
    headers, text = call(
        proxy, {"model": "rag", "messages": tool_turn(*PASSAGES), "metadata": THRESHOLD, "stream": stream}
    )
    want = pruned(engine, PASSAGES, threshold=0.3)
    assert contents(upstream.last(), "tool") == want and want != PASSAGES
    assert upstream.last().get("stream", False) is stream
    assert headers["x-prune-engine-pruned"] == "2"
    if stream:
        assert text.rstrip().endswith("data: [DONE]") and '"content":"o"' in text.replace(" ", "")
    else:
        assert json.loads(text)["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_messages_have_their_tool_results_pruned(proxy, engine, upstream, stream):
    uses = [{"type": "tool_use", "id": f"t{i}", "name": "search", "input": {}} for i in range(2)]
    results = [
        {"type": "tool_result", "tool_use_id": "t0", "content": PASSAGES[0]},
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": PASSAGES[1]}]},
    ]
    body = {
        "model": "rag",
        "max_tokens": 20,
        "stream": stream,
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ],
        "litellm_metadata": THRESHOLD,
    }
    headers, text = call(proxy, body, path="/v1/messages")
    assert ("message_stop" if stream else '"type":"message"') in text.replace(" ", "")
    got = [c if isinstance(c, str) else c[0]["text"] for c in contents(upstream.last(), "tool")]
    assert got == pruned(engine, PASSAGES, threshold=0.3) and headers["x-prune-engine-pruned"] == "2"


# --------------------------------------------------------------------------- opt-in: request, key, team


def test_a_call_not_opted_in_goes_untouched_and_says_nothing(proxy, upstream):
    headers, _ = call(proxy, {"model": "chat", "messages": tool_turn(*PASSAGES)})
    assert contents(upstream.last(), "tool") == PASSAGES and headers == {}


def test_a_request_opts_in_to_compression_and_to_plain_chats_context_tags(proxy, engine, upstream):
    layer = {
        "prune_tool_results": False,
        "compress_roles": ["tool"],
        "compress_rate": 0.5,
        "compress_min_chars": 0,
    }
    headers, _ = call(
        proxy, {"model": "chat", "messages": tool_turn(*PASSAGES), "metadata": {"prune_engine": layer}}
    )
    assert (
        contents(upstream.last(), "tool") == [compressed(engine, p, rate=0.5) for p in PASSAGES] != PASSAGES
    )
    assert headers["x-prune-engine-compressed"] == "2" and headers["x-prune-engine-pruned"] == "0"
    prompt = "".join(f"<context>{p}</context>\n" for p in PASSAGES) + QUESTION
    layer = {"prune_context_tags": True, "prune_options": {"threshold": 0.3}}
    call(
        proxy,
        {
            "model": "chat",
            "messages": [{"role": "user", "content": prompt}],
            "metadata": {"prune_engine": layer},
        },
    )
    want = "".join(f"<context>{p}</context>\n" for p in pruned(engine, PASSAGES, threshold=0.3)) + QUESTION
    assert contents(upstream.last(), "user") == [want] != [prompt]


def test_a_keys_metadata_opts_its_calls_in_and_a_request_overrides_it(proxy, engine, upstream):
    """The page's key metadata: the assistant's earlier turn compressed, the tool results pruned (the
    config's prune_tool_results, at the model's default threshold), both in one call."""
    messages = [
        *tool_turn(*PASSAGES),
        {"role": "assistant", "content": LONG},
        {"role": "user", "content": "And?"},
    ]
    headers, _ = call(proxy, {"model": "chat", "messages": messages}, key="sk-key")
    sent = upstream.last()
    assert contents(sent, "assistant")[-1] == compressed(engine, LONG, rate=0.5) != LONG
    against_and = engine_call(engine, "/v1/prune", {"question": "And?", "passages": PASSAGES})["results"]
    assert contents(sent, "tool") == [r["pruned_context"] for r in against_and]
    assert contents(sent, "user") == [QUESTION, "And?"]
    assert (headers["x-prune-engine-compressed"], headers["x-prune-engine-pruned"]) == ("1", "2")
    again = {"model": "chat", "messages": messages, "metadata": {"prune_engine": {"compress_rate": 0.3}}}
    call(proxy, again, key="sk-key")
    assert contents(upstream.last(), "assistant")[-1] == compressed(engine, LONG, rate=0.3)
    off = {"model": "chat", "messages": messages, "metadata": {"prune_engine": False}}
    headers, _ = call(proxy, off, key="sk-key")
    assert contents(upstream.last(), "assistant")[-1] == LONG and headers == {}


def test_a_teams_metadata_opts_its_calls_in_and_a_key_overrides_it(proxy, engine, upstream):
    prompt = "".join(f"<context>{p}</context>\n" for p in PASSAGES) + QUESTION
    body = {
        "model": "chat",
        "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt}],
    }
    headers, _ = call(proxy, body, key="sk-team")  # the page's team metadata
    want = "".join(f"<context>{p}</context>\n" for p in pruned(engine, PASSAGES, threshold=0.3)) + QUESTION
    assert contents(upstream.last(), "user") == [want] and headers["x-prune-engine-pruned"] == "2"
    assert contents(upstream.last(), "system") == ["Answer briefly."]
    headers, _ = call(proxy, body, key="sk-team-key-off")
    assert contents(upstream.last(), "user") == [prompt] and headers == {}


# --------------------------------------------------------------------------- fail-open


def _skipped(proxy, upstream, body: dict, key: str = "sk-plain") -> str:
    """Why the hook let `body`'s messages go as they came (the upstream got them unchanged)."""
    headers, text = call(proxy, body, key)
    assert json.loads(text)["choices"][0]["message"]["content"] == "ok"
    assert contents(upstream.last(), "tool") == contents(body, "tool")
    assert "x-prune-engine-tokens-after" not in headers
    return headers["x-prune-engine-skipped"]


def test_an_engine_past_the_budget_or_answering_an_error_lets_the_original_through(proxy, upstream):
    t0 = time.monotonic()
    slow = {"model": "chat", "messages": tool_turn(*PASSAGES), "guardrails": ["prune-engine-slow"]}
    assert _skipped(proxy, upstream, slow) == "the engine did not answer within the 0.5 s budget"
    assert time.monotonic() - t0 < 2.5  # not the stub's 3 s
    failing = {"model": "chat", "messages": tool_turn(*PASSAGES), "guardrails": ["prune-engine-error"]}
    assert _skipped(proxy, upstream, failing).endswith("/error/v1/prune answered 503: the engine failed")
    bad = {
        "model": "rag",
        "messages": tool_turn(*PASSAGES),
        "metadata": {"prune_engine": {"compress_rate": 2}},
    }
    assert _skipped(proxy, upstream, bad).startswith("bad settings: request metadata: ")
    nothing = {"model": "rag", "messages": [{"role": "user", "content": QUESTION}]}
    headers, _ = call(proxy, nothing)
    assert headers["x-prune-engine-skipped"] == "nothing to prune or compress"
    log = proxy[1].read_text()
    assert (
        "prune-engine: skipped (the engine did not answer within the 0.5 s budget); the original messages go upstream"
        in log
    )
    assert "answered 503: the engine failed); the original messages go upstream" in log


def test_a_bad_setting_is_an_error_line_and_the_proxy_starts_without_the_hook(proxy):
    log = proxy[1].read_text()
    assert (
        "Skipping guardrail 'prune-engine-typo': invalid configuration, proxy is starting WITHOUT this guardrail: "
        "prune-engine guardrail: unknown setting 'prune_tool_result'; its settings are api_base," in log
    )
    assert "Skipping guardrail 'prune-engine'" not in log


def test_with_the_engine_stopped_the_original_goes_upstream(proxy, engine, upstream):
    """The module's last test: it stops the engine."""
    engine[2].terminate()
    engine[2].wait(timeout=30)
    why = _skipped(proxy, upstream, {**DOC_REQUEST, "stream": False})
    assert why.startswith(f"{engine[0]}/v1/prune unreachable: ConnectError")
    log = proxy[1].read_text()
    assert f"prune-engine: skipped ({engine[0]}/v1/prune unreachable: ConnectError" in log
    assert ENGINE_KEY not in log
