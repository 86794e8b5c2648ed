"""The outputs the README pastes are what the commands print now: the same commands on the
same inputs with the default model, compared line by line (results exactly; timings,
paths and counts of work by their shape), so the docs and the code cannot drift apart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from engine.cli import main

pytestmark = pytest.mark.inprocess


ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RETRIEVAL = (ROOT / "docs" / "retrieval.md").read_text(encoding="utf-8")


def _blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of `text`, in order (any info string)."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _blocks_after(marker: str, count: int = 1, page: str = README) -> list[list[str]]:
    """The `count` code blocks of `page` that follow the line starting with `marker`."""
    blocks = _blocks(page[page.index(marker) :])[:count]
    assert len(blocks) == count, marker
    return blocks


def _command_before(marker: str, page: str = README) -> list[list[str]]:
    """The commands of `page`'s code block just before the line starting with `marker`."""
    block = _blocks(page[: page.index(marker)])[-1]
    return [shlex.split(line)[1:] for line in block if line.startswith("prune ")]


def _shape(line: str) -> str:
    """A line with its timings, paths and numbers masked."""
    line = re.sub(r"(~|/)[^\s()]*", "PATH", line)
    return re.sub(r"\d+(\.\d+)?", "N", line)


def _same(documented: list[str], printed: list[str], exact: re.Pattern) -> None:
    """Every documented line is printed, in order: lines matching `exact` as they are (or,
    cut at "[...]", their pieces in order), the others by shape."""
    pos = 0
    for want in documented:
        for k in range(pos, len(printed)):
            got = printed[k]
            if exact.search(want):
                pieces = [p.strip() for p in want.split("[...]")]
                ok = got == want or ("[...]" in want and _in_order(pieces, got))
            else:
                ok = _shape(got) == _shape(want)
            if ok:
                pos = k + 1
                break
        else:
            pytest.fail(
                f"the README shows {want!r}, which no line printed after line {pos} matches:\n"
                + "\n".join(printed)
            )


def _in_order(pieces: list[str], line: str) -> bool:
    at = 0
    for p in pieces:
        at = line.find(p, at)
        if at < 0:
            return False
        at += len(p)
    return True


def _run(args: list[str], capsys, cwd: Path, monkeypatch) -> list[str]:
    monkeypatch.chdir(cwd)
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return (out.err + out.out).splitlines()


def test_the_main_jobs_pasted_output(default_cache, capsys, monkeypatch):
    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    (args,) = _command_before("Real output (first run")
    printed = _run(args, capsys, ROOT, monkeypatch)
    (block,) = _blocks_after("Real output (first run")
    documented = block[block.index(next(line for line in block if line.startswith("# model"))) :]
    # the README's machine picked fp32 by auto, the reference the suite runs on every machine
    # (default_cache), so the results it pastes are fp32's: compared exactly
    assert "fp32 export (auto's pick)" in documented[0]
    documented[0] = documented[0].replace(" (auto's pick)", "")
    _same(documented, printed, re.compile(r"^(## passage|  \[[x ]\]|pruned_context:|[A-Z])"))


def test_the_retrieval_examples_pasted_output(default_cache, capsys, monkeypatch, tmp_path):
    pytest.importorskip("milvus_lite")
    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    index, ask = _command_before("Real output (models already in the cache", RETRIEVAL)
    index = [str(ROOT / a) if a.startswith("examples/") else a for a in index]
    indexed, asked = _blocks_after("Real output (models already in the cache", 2, RETRIEVAL)
    _same(indexed, _run(index, capsys, tmp_path, monkeypatch), re.compile(r"^$^"))
    _same(
        asked,
        _run(ask, capsys, tmp_path, monkeypatch),
        re.compile(r"^(## \[|\[\d\] \(source|# pruned context|[A-Z])"),
    )


def test_the_http_apis_pasted_output(default_cache, lingua_exports, monkeypatch):
    """The README's and docs/http-api.md's curl calls, sent to the app with the default
    model (the LLMLingua-2 section's to one with the tiny LLMLingua-2 checkpoint's INT8 export,
    as the page made it: `prune test-checkpoint --family llmlingua2`, the tests' XLM-R one; its
    "compressor beside a pruner" part's to the default model with that export beside it): the
    same JSON back (ids and scores as printed, a fresh Cohere id aside)."""
    pytest.importorskip("fastapi")
    import json
    from fastapi.testclient import TestClient
    from engine.compressor import Compressor
    from engine.http.app import ApiConfig, create_app
    from engine.pruner import Pruner

    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    pruner = Pruner.load("default")
    client = TestClient(create_app(pruner, ApiConfig(model_name="default")))
    compressor = Compressor.load(lingua_exports["xlm-roberta", "int8"])
    lingua = TestClient(create_app(compressor, ApiConfig(model_name="lingua-int8")))
    both = TestClient(
        create_app(Pruner.load("default", compressor=compressor), ApiConfig(model_name="default"))
    )
    api = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    at = api.index("## LLMLingua-2")
    beside = api.index("### A compressor beside a pruner", at)
    end = api.index("\n## ", at + 1)
    pages = [
        (README, client),
        (api[:at] + api[end:], client),
        (api[at:beside], lingua),
        (api[beside:end], both),
    ]
    calls = 0
    for page, client in pages:
        for block in _blocks(page):
            for k, line in enumerate(block[:-1]):
                if not line.startswith("$ curl -s localhost:8080/"):
                    continue
                words = shlex.split(line[2:])
                route = words[2].removeprefix("localhost:8080")
                data = words[words.index("-d") + 1] if "-d" in words else None
                reply = client.post(route, json=json.loads(data)) if data else client.get(route)
                got, documented = reply.json(), json.loads(block[k + 1])
                if isinstance(documented, dict) and "id" in documented:
                    got["id"] = documented["id"]
                assert _close(got, documented), (route, got)
                calls += 1
    assert calls >= 7


def _close(a, b, tol=1e-5) -> bool:
    """Equal JSON, numbers within `tol` (another CPU may round the last digits otherwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    return a == b


def test_the_text_models_pasted_output(default_cache, monkeypatch):
    """docs/triton.md's curl call to the default text model: the outputs it pastes are the
    engine's on that request now. The text model runs the in-process Pruner and writes its
    results with `results_to_tensors` (tests/server/test_text_model.py holds the two equal),
    so the default model in process gives what the server sent, without a server here."""
    import json
    from engine.pruner import Pruner
    from engine.triton.wire import results_to_tensors

    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    page = (ROOT / "docs" / "triton.md").read_text(encoding="utf-8")
    (call,), (pasted,) = (
        _blocks_after("One request is one question", page=page),
        _blocks_after("Real output", page=page),
    )
    body = " ".join(call).split(" -d ", 1)[1]
    request = json.loads(shlex.split(body)[0])
    inputs = {i["name"]: i["data"] for i in request["inputs"]}
    outputs = {o["name"]: o for o in json.loads("".join(pasted))["outputs"]}
    results = Pruner.load("default").prune(inputs["question"][0], inputs["passages"])
    tensors = results_to_tensors(results)
    assert list(outputs) == list(tensors)
    for name, got in tensors.items():
        values = [v.decode() for v in got.ravel()] if got.dtype == object else got.ravel().tolist()
        assert list(got.shape) == outputs[name]["shape"], name
        assert _close(values, outputs[name]["data"]), (name, values)


def test_the_readmes_python_runs_as_written(default_cache, monkeypatch, capsys):
    """The README's "From Python" block, run from the repository's root, prints a line per
    passage of the main job: the same reranking scores and pruned passages as `prune run`
    (whose output test_the_main_jobs_pasted_output checks)."""
    for k, v in default_cache["env"].items():
        monkeypatch.setenv(k, v)
    start = README.index("## From Python")
    (block,) = _blocks(README[start : README.index("\n## ", start + 1)])
    monkeypatch.chdir(ROOT)
    exec(compile("\n".join(block), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    (shown,) = _blocks_after("Real output (first run")
    scores = [
        line.split("reranking_score ")[1].split(",")[0] for line in shown if line.startswith("## passage")
    ]
    assert [int(line.split()[0]) for line in printed] == list(range(len(scores))), printed
    assert all(abs(float(line.split()[1]) - float(s)) < 6e-4 for line, s in zip(printed, scores)), printed
    kept = [line for line in shown if line.startswith("  [x]")]
    texts = [line.split(maxsplit=2)[2] for line in printed if not line.endswith("(emptied)")]
    assert len(texts) == len(kept) and all(
        t.startswith(k.split(maxsplit=2)[2]) for t, k in zip(texts, kept)
    ), printed


def test_the_compressor_on_tritons_pasted_output(lingua_exports, tiktoken_offline):
    """docs/triton.md's LLMLingua-2 run on `prune test-checkpoint --family llmlingua2` (the tiny
    XLM-R checkpoint, seed 0: lingua_exports' fp32 export of it): the prompt its printf writes and
    the body its curl sends give what it pastes. The served text model answers as the export in
    process (tests/server/test_compress_triton.py holds the two equal)."""
    import json

    from engine.compressor import Compressor

    page = (ROOT / "docs" / "triton.md").read_text(encoding="utf-8")
    commands, pasted = _blocks_after("## An LLMLingua-2 compressor", count=2, page=page)
    script = " ".join(line.rstrip("\\").strip() for line in commands)
    prompt = shlex.split(script.split("printf ", 1)[1])[0].replace("\\n", "\n")
    body = json.loads(shlex.split(script.split(" -d ", 1)[1])[0])
    compressor = Compressor.load(lingua_exports["xlm-roberta", "fp32"], threads=1)
    printed = compressor.compress(prompt, rate=0.33, force_tokens=["\n", "?"])
    start = next(i for i, line in enumerate(pasted) if line.startswith("$ prune compress")) + 2
    end = next(i for i, line in enumerate(pasted) if " tokens -> " in line)
    assert "\n".join(pasted[start:end]) == printed.compressed_prompt
    assert pasted[end].startswith(f"{printed.origin_tokens} tokens -> {printed.compressed_tokens} ")
    answer = json.loads(pasted[pasted.index("$ curl ...") + 1])
    context = body.pop("context")
    assert answer == json.loads(json.dumps(compressor.compress(context, **body).to_dict()))
