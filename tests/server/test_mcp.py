"""`prune mcp` through the MCP SDK's own client: over stdio (the client starts the command of
docs/integrations.md's `mcpServers` config as its subprocess) and over streamable HTTP (the docs'
HTTP command, started here). The tools are listed with their schemas; each result is the in-process
Pruner's or Compressor's on the same exports, field by field; bad input is an error result carrying
the engine's message, and the next call still works. The suite's tiny random-weight exports stand
in for the docs' build/provence and build/lingua."""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.utils import CASES, EN, PASSAGES, PRUNE, QUESTION, free_ports

pytestmark = pytest.mark.server

pytest.importorskip("mcp", reason="the dev extra's mcp (the MCP SDK)")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
#: the docs' folders, which the fixtures' exports stand for, and the docs' HTTP port
PRUNER_DIR, LINGUA_DIR, DOC_PORT = "build/provence", "build/lingua", "8000"
#: the servers' limits here: small, so that a call past them is small too
MAX_PASSAGES, MAX_CHARS = 20, 20_000
#: what the servers run with: those limits, and one model thread as in this process (the same floats)
ENV = {
    "PRUNE_MAX_PASSAGES": str(MAX_PASSAGES),
    "PRUNE_MAX_CALL_CHARS": str(MAX_CHARS),
    "PRUNE_INTRA_OP_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
}


# --------------------------------------------------------------------------- the docs' section


def _section() -> str:
    text = DOC.read_text()
    return text[text.index("## MCP server: `prune mcp`") :]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", _section(), re.S)


def doc_config() -> dict:
    """The docs' `mcpServers` config, parsed."""
    (block,) = [b for b in _blocks("json") if "mcpServers" in b]
    return json.loads(block)


def doc_command(needle: str) -> list[str]:
    """The words of the docs' `prune mcp` line that holds `needle` (its comment dropped)."""
    lines = [line for b in _blocks("bash") for line in b.splitlines() if line.startswith("prune mcp ")]
    (line,) = [line for line in lines if needle in line]
    return shlex.split(line, comments=True)


def doc_client() -> str:
    """The docs' Python client."""
    (block,) = [b for b in _blocks("python") if "call_tool" in b]
    return block


def local_words(words: list[str], exports: tuple[Path, Path], port: int | None = None) -> list[str]:
    """`words` with the exports for the docs' folders (absolute or relative) and `port` for its port."""
    swap = {PRUNER_DIR: str(exports[0]), LINGUA_DIR: str(exports[1])}
    out = [next((v for k, v in swap.items() if w == k or w.endswith("/" + k)), w) for w in words]
    return [str(port) if port is not None and w == DOC_PORT else w for w in out]


# --------------------------------------------------------------------------- a client held open


class Session:
    """The SDK's Client, connected for a module's tests: opened and closed by one task on an
    event loop in a thread (the SDK's task groups stay in the task that opened them), called
    from the tests. `server` is what Client takes (a URL, a transport, an MCPServer)."""

    def __init__(self, server):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="mcp-client", daemon=True).start()
        self._ready = threading.Event()
        self._main = asyncio.run_coroutine_threadsafe(self._hold(server), self.loop)
        while not self._ready.wait(0.1):
            if self._main.done():
                self._main.result()  # raises what stopped it

    async def _hold(self, server) -> None:
        from mcp import Client

        self._closing = asyncio.Event()
        async with AsyncExitStack() as stack:
            self.client = await stack.enter_async_context(Client(server))
            self._ready.set()
            await self._closing.wait()

    def run(self, coro, timeout: float = 120):
        """`coro` on the session's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, tool: str, arguments: dict):
        """tools/call; the CallToolResult."""
        return self.run(self.client.call_tool(tool, arguments))

    def tools(self) -> dict:
        """tools/list: name -> Tool."""
        return {t.name: t for t in self.run(self.client.list_tools()).tools}

    def close(self) -> None:
        """Close the client (a stdio server ends with it), then the loop."""
        self.loop.call_soon_threadsafe(self._closing.set)
        self._main.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def exports(exported, lingua_exports) -> tuple[Path, Path]:
    """(pruner export, LLMLingua-2 export): what build/provence and build/lingua stand for."""
    return exported["provence"], lingua_exports[("xlm-roberta", "fp32")]


@pytest.fixture(scope="module")
def local(exports):
    """The same exports in this process, on one thread: (Pruner, Compressor)."""
    from engine.compressor import Compressor
    from engine.pruner import Pruner

    pruner, compressor = Pruner.load(exports[0], threads=1), Compressor.load(exports[1], threads=1)
    yield pruner, compressor
    pruner.close()
    compressor.close()


#: what each transport's server was started with: "stdio" (the client's command and args), "http"
RAN: dict[str, list[str]] = {}


@pytest.fixture(scope="module")
def http_server(exports):
    """The docs' HTTP command on a free port; yields its /mcp URL."""
    (port,) = free_ports(1)
    words = local_words(doc_command("streamable-http"), exports, port)
    RAN["http"] = words
    proc = subprocess.Popen(
        [str(PRUNE), *words[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ENV},
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 120
    while not _answers(url):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines[-30:])
        time.sleep(0.2)
    yield url
    proc.terminate()
    # uvicorn shuts down (the app's lifespan ends), then re-raises SIGTERM, as under prune api
    assert proc.wait(30) in (0, -signal.SIGTERM), "".join(lines[-30:])
    assert any("Application shutdown complete" in line for line in lines), lines
    assert any(f"on {url}" in line and "prune_context, compress_text" in line for line in lines), lines


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` (any status)."""
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture(scope="module", params=["stdio", "streamable-http"])
def session(request, exports, tmp_path_factory):
    """A client connected to `prune mcp`: the docs' config's command started by the SDK's stdio
    client ("prune" found on PATH), or the docs' HTTP command (http_server)."""
    if request.param == "stdio":
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        entry = doc_config()["mcpServers"]["prune"]
        args = local_words(entry["args"], exports)
        RAN["stdio"] = [entry["command"], *args]
        path = f"{PRUNE.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        params = StdioServerParameters(command=entry["command"], args=args, env={**ENV, "PATH": path})
        log = tmp_path_factory.mktemp("mcp") / "stderr.txt"
        with open(log, "w") as errlog:  # the server's stderr: its start line, its logs
            s = Session(stdio_client(params, errlog=errlog))
            yield s
            s.close()
        assert "tools prune_context, compress_text; on stdio" in log.read_text(), log.read_text()
    else:
        s = Session(request.getfixturevalue("http_server"))
        yield s
        s.close()


# --------------------------------------------------------------------------- what the engine gives


def expected_passages(results) -> list[dict]:
    """Pruner.prune's results as prune_context gives them."""
    return [
        {
            "index": r.index,
            "pruned_context": r.pruned_context,
            "reranking_score": r.reranking_score,
            "kept_spans": [[s.start, s.end] for s in r.sentences if s.kept],
            "compression_rate": r.compression_rate,
            "budget": None if r.budget is None else r.budget.to_dict(),
        }
        for r in results
    ]


def expected_compression(result) -> dict:
    """Compressor.compress's result as compress_text gives it."""
    return {
        "compressed_text": result.compressed_prompt,
        "kept_spans": [list(span) for span in result.kept_spans[0]],
        "origin_tokens": result.origin_tokens,
        "compressed_tokens": result.compressed_tokens,
    }


def engine_call(local, tool: str, args: dict):
    """What the tool runs, in this process: Pruner.prune or Compressor.compress on `args`."""
    pruner, compressor = local
    if tool == "prune_context":
        options = {k: args[k] for k in ("threshold", "budget_tokens") if k in args}
        return pruner.prune(args["question"], args["passages"], **options)
    options = {k: args[k] for k in ("rate", "target_token", "force_tokens") if k in args}
    return compressor.compress(args["text"], **options)


def ok(result) -> dict:
    """A tool result's structured content, checked: no error, and its text block the same JSON."""
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


# --------------------------------------------------------------------------- the tools


def test_the_tools_are_listed_with_their_schemas(session):
    tools = session.tools()
    assert set(tools) == {"prune_context", "compress_text"}
    prune, compress = tools["prune_context"], tools["compress_text"]
    limits = f"at most {MAX_PASSAGES} passages and {MAX_CHARS} characters in one call"
    assert limits in prune.description.lower() and "reranking_score" in prune.description
    schema = prune.input_schema
    assert schema["required"] == ["question", "passages"]
    assert set(schema["properties"]) == {"question", "passages", "threshold", "budget_tokens"}
    assert (schema["properties"]["threshold"]["minimum"], schema["properties"]["threshold"]["maximum"]) == (
        0,
        1,
    )
    assert schema["properties"]["budget_tokens"]["minimum"] == 1
    assert schema["properties"]["passages"]["maxItems"] == MAX_PASSAGES
    assert limits in schema["properties"]["passages"]["description"]
    assert set(prune.output_schema["properties"]) == {"results"}
    passage = prune.output_schema["$defs"]["PrunedPassage"]["properties"]
    assert set(passage) == {
        "index",
        "pruned_context",
        "reranking_score",
        "kept_spans",
        "compression_rate",
        "budget",
    }
    schema = compress.input_schema
    assert schema["required"] == ["text"]
    assert set(schema["properties"]) == {"text", "rate", "target_token", "force_tokens"}
    rate = schema["properties"]["rate"]
    assert (rate["exclusiveMinimum"], rate["maximum"]) == (0, 1)
    assert schema["properties"]["target_token"]["minimum"] == 1
    assert set(compress.output_schema["properties"]) == {
        "compressed_text",
        "kept_spans",
        "origin_tokens",
        "compressed_tokens",
    }
    for tool in (prune, compress):
        assert all(p.get("description") for p in tool.input_schema["properties"].values()), tool.name
        assert tool.annotations.read_only_hint and not tool.annotations.destructive_hint


PRUNE_CASES = {
    "defaults": (QUESTION, PASSAGES, {}),
    "threshold": (QUESTION, PASSAGES, {"threshold": 0.6}),
    "budget": (QUESTION, PASSAGES, {"budget_tokens": 60}),
    "an empty passage": (
        QUESTION,
        ["", "Paris is the capital of France. It is on the Seine."],
        {"threshold": 0.0},
    ),
}


@pytest.mark.parametrize("case", list(PRUNE_CASES))
def test_prune_context_is_the_pruners(session, local, case):
    question, passages, options = PRUNE_CASES[case]
    got = ok(session.call("prune_context", {"question": question, "passages": passages, **options}))
    assert got["results"] == expected_passages(local[0].prune(question, passages, **options))
    for r, passage in zip(got["results"], passages):
        assert all(passage[a:b] in r["pruned_context"] for a, b in r["kept_spans"])


def test_the_prune_cases_keep_some_and_cut_some(local):
    """The cases above are no trivial comparison: the tiny model keeps some sentences and cuts others."""
    kept = [
        s.kept for q, p, o in PRUNE_CASES.values() for r in local[0].prune(q, p, **o) for s in r.sentences
    ]
    assert any(kept) and not all(kept)
    budget = local[0].prune(*PRUNE_CASES["budget"][:2], **PRUNE_CASES["budget"][2])
    assert sum(r.budget.cut for r in budget) > 0


#: llmlingua's cases of one text with the tool's options (tests/utils.py's CASES)
COMPRESS_CASES = {
    name: (text, options)
    for name, (text, options) in CASES.items()
    if isinstance(text, str) and set(options) <= {"rate", "target_token", "force_tokens"}
}


@pytest.mark.parametrize("case", list(COMPRESS_CASES))
def test_compress_text_is_the_compressors(session, local, case):
    text, options = COMPRESS_CASES[case]
    got = ok(session.call("compress_text", {"text": text, **options}))
    assert got == expected_compression(local[1].compress(text, **options))


def test_the_compress_cases_cover_the_options():
    assert len(COMPRESS_CASES) >= 5
    assert {k for _, o in COMPRESS_CASES.values() for k in o} == {"rate", "target_token", "force_tokens"}


# --------------------------------------------------------------------------- bad input

BAD = {
    "empty question": ("prune_context", {"question": "", "passages": ["It was built in 1923."]}),
    "blank question": ("prune_context", {"question": " \n", "passages": ["It was built in 1923."]}),
    "threshold out of range": ("prune_context", {"question": "When?", "passages": ["x"], "threshold": 1.5}),
    "budget of 0 tokens": ("prune_context", {"question": "When?", "passages": ["x"], "budget_tokens": 0}),
    "too many passages": ("prune_context", {"question": "When?", "passages": ["x"] * (MAX_PASSAGES + 1)}),
    "a passage past the characters": ("prune_context", {"question": "When?", "passages": ["a" * MAX_CHARS]}),
    "rate out of range": ("compress_text", {"text": EN, "rate": 1.5}),
    "rate 0": ("compress_text", {"text": EN, "rate": 0.0}),
    "target_token 0": ("compress_text", {"text": EN, "target_token": 0}),
    "empty text": ("compress_text", {"text": " \n "}),
    "a text past the characters": ("compress_text", {"text": "a " * MAX_CHARS}),
}


def engine_message(local, tool: str, args: dict) -> str:
    """The engine's InputError on `args`, in this process with the server's limits."""
    from engine.errors import InputError
    from engine.pipeline.inputs import Limits

    limited = tuple(copy.copy(m) for m in local)
    for m in limited:
        m.limits = Limits(max_passages=MAX_PASSAGES, max_chars=MAX_CHARS)
    with pytest.raises(InputError) as exc:
        engine_call(limited, tool, args)
    return str(exc.value)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_an_error_result_with_the_engines_message(session, local, case):
    tool, args = BAD[case]
    result = session.call(tool, args)
    assert result.is_error and result.structured_content is None
    assert [c.text for c in result.content] == [
        f"Error executing tool {tool}: {engine_message(local, tool, args)}"
    ]
    # the server goes on: the next call is answered as before
    good = {"question": QUESTION, "passages": PASSAGES[:2]}
    assert ok(session.call("prune_context", good))["results"] == expected_passages(local[0].prune(**good))


def test_arguments_off_the_schema_are_an_error_result_too(session, local):
    """What the schema refuses (a number for the passages, an unknown tool) is the SDK's error
    result, naming the argument; the server goes on."""
    result = session.call("prune_context", {"question": "When?", "passages": 5})
    assert result.is_error and "passages" in result.content[0].text
    result = session.call("compress_text", {"rate": 0.5})
    assert result.is_error and "text" in result.content[0].text
    good = {"text": EN, "rate": 0.4}
    assert ok(session.call("compress_text", good)) == expected_compression(local[1].compress(EN, rate=0.4))


# --------------------------------------------------------------------------- in this process


@pytest.fixture(scope="module")
def held(local):
    """An in-process server (the SDK's Client connects to the MCPServer object) whose pruner waits
    `delay` seconds before each call, within a 1 s timeout; (session, the pruner's state)."""
    from engine.errors import Cancelled
    from engine.http.mcp_server import create_server

    state = {"delay": 0.0, "stopped": threading.Event()}

    class Slow:
        def __getattr__(self, name):
            return getattr(local[0], name)

        def prune(self, *args, **kwargs):
            time.sleep(state["delay"])
            try:
                return local[0].prune(*args, **kwargs)
            except Cancelled:
                state["stopped"].set()
                raise

    s = Session(create_server(Slow(), local[1], timeout=1.0))
    yield s, state
    s.close()


def test_a_call_runs_off_the_event_loop(held, local):
    """While a call runs on its worker thread (0.8 s here), the server answers other requests: the
    client and this in-process server share one event loop, which a call run on it would hold."""
    s, state = held
    state["delay"] = 0.8
    try:

        async def both():
            t0 = time.monotonic()
            call = asyncio.ensure_future(
                s.client.call_tool("prune_context", {"question": "When?", "passages": ["x"]})
            )
            await asyncio.sleep(0.1)
            await s.client.list_tools()
            listed = time.monotonic() - t0
            return await call, listed, time.monotonic() - t0

        result, listed, called = s.run(both())
    finally:
        state["delay"] = 0.0
    assert listed < 0.5 <= 0.8 <= called, (listed, called)
    assert ok(result)["results"] == expected_passages(local[0].prune("When?", ["x"]))


def test_a_call_past_the_timeout_is_stopped_and_the_next_works(held, local):
    s, state = held
    state["delay"] = 1.5
    try:
        t0 = time.monotonic()
        result = s.call("prune_context", {"question": QUESTION, "passages": PASSAGES})
        assert time.monotonic() - t0 < 1.4
    finally:
        state["delay"] = 0.0
    assert result.is_error
    assert result.content[0].text == (
        "Error executing tool prune_context: the call took longer than 1 s (--request-timeout) and was stopped"
    )
    assert state["stopped"].wait(10)  # its work stopped at its first model batch
    good = {"question": QUESTION, "passages": PASSAGES}
    assert ok(s.call("prune_context", good))["results"] == expected_passages(local[0].prune(**good))


def test_the_http_app_asks_for_the_api_key_and_bounds_the_body(local):
    """Over HTTP with --api-key, a request without `Authorization: Bearer KEY` is answered 401 (the
    HTTP API's rule); a body past --max-body-bytes 413; the SDK's DNS-rebinding check stays on."""
    from starlette.testclient import TestClient

    from engine.http.mcp_server import create_server, http_app

    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    app = http_app(create_server(compressor=local[1]), "127.0.0.1", 4_000, api_key="sekret")
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            refused = client.post("/mcp", json=init, headers={**headers, **auth})
            assert refused.status_code == 401 and "Bearer KEY" in refused.json()["error"]
        key = {**headers, "Authorization": "bearer sekret"}
        assert client.post("/mcp", json=init, headers=key).status_code == 200
        assert client.post("/mcp", content=b" " * 5_000, headers=key).status_code == 413
        elsewhere = client.post("/mcp", json=init, headers={**key, "Host": "evil.example:8000"})
        assert elsewhere.status_code == 421


# --------------------------------------------------------------------------- the docs


def test_the_docs_config_and_commands_are_what_the_tests_ran(exports):
    """The docs' `mcpServers` entry parses; its command is `prune mcp` with the docs' folders, the
    same as the docs' stdio line, and parses with the real CLI; the servers above ran exactly it and
    the docs' HTTP line, with the exports for the folders (and a free port)."""
    from engine.cli import build_parser

    entry = doc_config()["mcpServers"]["prune"]
    assert set(entry) == {"command", "args"} and entry["command"] == "prune" == PRUNE.name
    relative = [re.sub(r"^/.*/(build/\w+)$", r"\1", a) for a in entry["args"]]
    assert ["prune", *relative] == doc_command("stdio")
    args = build_parser().parse_args(entry["args"])
    assert (args.command, args.transport) == ("mcp", "stdio")
    assert (args.model.endswith(PRUNER_DIR), args.compressor.endswith(LINGUA_DIR)) == (True, True)
    http = doc_command("streamable-http")
    args = build_parser().parse_args(http[1:])
    assert (args.transport, args.host, str(args.port)) == ("streamable-http", "127.0.0.1", DOC_PORT)
    if "stdio" in RAN:  # what the session fixture started
        assert RAN["stdio"] == [entry["command"], *local_words(entry["args"], exports)]
    if "http" in RAN:
        port = int(RAN["http"][RAN["http"].index("--port") + 1])
        assert RAN["http"] == local_words(http, exports, port)


def test_the_docs_client_runs(http_server, local):
    """The docs' Python client, against the docs' HTTP command: it prints the first passage's pruned
    text, the in-process pruner's on its question and passages."""
    code = doc_client()
    assert "http://127.0.0.1:8000/mcp" in code
    call = next(
        n
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "call_tool"
    )
    arguments = ast.literal_eval(call.args[1])
    out = subprocess.run(
        [sys.executable, "-c", code.replace("http://127.0.0.1:8000/mcp", http_server)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == local[0].prune(**arguments)[0].pruned_context + "\n"
