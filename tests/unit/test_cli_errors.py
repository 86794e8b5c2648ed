"""Every input error of every `prune` subcommand is one line on stderr and exit status 2, as
argparse's own errors (`prune run: error: ...`): a missing or unreadable input file, an
output path in a missing folder or where a folder stands, a bad value. Each is found before
any model is exported or loaded, so a user hears of a typo at once, never after a first-use
export, and never as a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import COMMANDS, main

pytestmark = pytest.mark.unit

BATCH = json.dumps({"question": "Who built it?", "passages": ["It was built in 1923."]})

# (subcommand and its flags, a piece of the one line it must print); run in a folder that
# holds q.jsonl (a good batch file), folder/ (a folder), bad.txt (not UTF-8), cut.jsonl (a
# line cut short), tab.jsonl (a raw tab inside a string on line 3), passages.jsonl (two
# passages, --passages-file's format), plain.txt (a passage of plain text) and nothing else
CASES = [
    # run
    ("run --input missing.jsonl", "--input missing.jsonl: no such file"),
    ("compress --model m --file missing.txt", "--file missing.txt: no such file"),
    ("compress --model m --text hi --rate 1.5", "rate must be a number in (0, 1], got 1.5"),
    ("run --input folder", "--input folder: is a folder, not a file"),
    ("run --input q.jsonl --output nodir/r.jsonl", "--output nodir/r.jsonl: no folder nodir"),
    ("run --input q.jsonl --output folder", "--output folder: is a folder"),
    ("run --question q --context-file missing.txt", "--context-file missing.txt: no such file"),
    ("run --question q --context-file bad.txt", "--context-file bad.txt: not UTF-8 text"),
    ("run --question q --passages-file folder", "--passages-file folder: is a folder"),
    ("run --question q --passages-file cut.jsonl", "cut.jsonl: line 1: not valid JSON: expecting"),
    (
        "run --question q --passages-file tab.jsonl",
        "--passages-file tab.jsonl: line 3: not valid JSON: invalid control character at column 12",
    ),
    (
        "run --question q --passage-file q.jsonl",  # a misspelt flag: its nearest, and the subcommand's --help
        "prune run: error: unrecognized arguments: --passage-file q.jsonl; did you mean --passages-file "
        "(not --passage-file)? (prune run --help shows the usage)",
    ),
    # no option is abbreviated: `--text` was taken as --text-model and the passage ignored (exit 0)
    ("run --question q --text x", "unrecognized arguments: --text x; did you mean --context (not --text)?"),
    ("compress --model m --context x", "did you mean --text (not --context)?"),
    (
        "run --question q --cont x",
        "--cont x; options are not abbreviated: --cont is not --context or --context-file",
    ),
    ("compress --model m --tex x", "options are not abbreviated: --tex is not --text-model or --text"),
    ("-q run --ques q --context c", "options are not abbreviated: --ques is not --question"),
    # a passages file given as one passage, a passage given as a passages file: what to use instead
    (
        "run --question q --context-file passages.jsonl",
        "--context-file passages.jsonl: holds 2 JSON lines of passages (--passages-file's format), but "
        "--context-file takes a whole file as one passage of plain text: use --passages-file passages.jsonl",
    ),
    (
        "run --question q --passages-file plain.txt",
        "--passages-file plain.txt: line 1: not valid JSON: expecting value at column 1; --passages-file reads "
        "JSON lines (a JSON string or an object with text, one passage a line): a plain-text file holding "
        "one passage is --context-file plain.txt",
    ),
    ("run --input q.jsonl --group 0", "argument --group: invalid positive integer value: '0'"),
    ("run --question q --context c --top-k 0", "top_k must be a positive integer"),
    ("run --question q --context c --threshold 2", "threshold must be in [0, 1]"),
    ("run --question q --context c --budget-tokens 0", "budget_tokens must be a positive integer"),
    ("run --question q --context c --max-batch-tokens 0", "argument --max-batch-tokens"),
    ("run --question q --context c --highlight --pre '<b>'", "--pre without --post: tags come in pairs"),
    ("run --model missing-model --question q --context c", "missing-model: no such model folder"),
    ("run --question q", "give at least one --context"),
    # a misspelt subcommand: its nearest
    ("rn --question q", "invalid choice: 'rn' (choose from 'export', 'run', "),
    ("rn --question q", "; did you mean run (not rn)? (prune --help shows the usage)"),
    ("-q evl", "; did you mean eval (not evl)?"),
    # eval
    ("eval --data missing.jsonl", "--data missing.jsonl: no such file"),
    ("eval --rag-data folder", "--rag-data folder: is a folder"),
    ("eval --data q.jsonl", "q.jsonl: record 1 lacks context, sentences, labels"),
    ("eval --rag-data cut.jsonl", "cut.jsonl: line 1: not valid JSON: expecting"),
    ("eval --rag-data q.jsonl --out q.jsonl", "--out q.jsonl: is a file, not a folder"),
    ("eval --rag-data q.jsonl --rag-limit 0", "argument --rag-limit: invalid positive integer"),
    ("eval", "give --data (sentence labels) and/or --rag-data"),
    # fidelity
    ("fidelity --model m --data missing.jsonl", "--data missing.jsonl: no such file"),
    ("fidelity --model m --data q.jsonl --out folder", "--out folder: is a folder"),
    ("fidelity --model m --data q.jsonl --limit -1", "argument --limit: invalid positive integer"),
    ("fidelity --model missing-model --data q.jsonl", "missing-model: no such model folder"),
    ("fidelity --data q.jsonl", "the following arguments are required: --model"),
    # export
    ("export --model missing-model --out ex", "--model missing-model: no such folder"),
    ("export --model folder --out ex --calibration missing.txt", "--calibration missing.txt: no such file"),
    ("export --model folder --out ex --gate-data folder", "--gate-data folder: is a folder"),
    ("export --model folder --out q.jsonl", "--out q.jsonl: is a file, not a folder"),
    ("export --model folder --out ex --opset 0", "argument --opset: invalid positive integer"),
    # repository
    ("repository --model missing-model --out repo", "missing-model: no such model folder"),
    ("repository --out q.jsonl", "--out q.jsonl: is a file, not a folder"),
    ("repository --out repo --instances 0", "argument --instances: invalid positive integer"),
    # api
    ("api --model missing-model", "missing-model: no such model folder"),
    ("api --port 70000", "argument --port: invalid port (0-65535) value: '70000'"),
    ("api --request-timeout 0", "argument --request-timeout: invalid positive number"),
    ("api --port 8123 --model-service-port 8123", "--port and --model-service-port are both 8123"),
    # mcp
    ("mcp --model missing-model", "missing-model: no such model folder"),
    (
        "mcp --transport streamable-http --port 70000",
        "argument --port: invalid port (0-65535) value: '70000'",
    ),
    ("mcp --transport sse", "argument --transport: invalid choice: 'sse'"),
    ("mcp --request-timeout 0", "argument --request-timeout: invalid positive number"),
    (
        "api --server localhost:1 --compressor folder",
        "--compressor loads beside an in-process pruner (--model)",
    ),
    (
        "api --model folder --compressor folder",
        "--compressor folder: not an LLMLingua-2 checkpoint or export",
    ),
    # serve
    ("serve --model-repository missing-repo", "--model-repository missing-repo: no such folder"),
    ("serve --model-repository folder --grpc-port -1", "argument --grpc-port: invalid port"),
    # bench
    ("bench --data missing.jsonl", "--data missing.jsonl: no such file"),
    ("bench --data q.jsonl", "q.jsonl: record 1 lacks gold: not a RAG file"),
    ("bench --data cut.jsonl", "cut.jsonl: line 1: not valid JSON: expecting"),
    ("bench --data q.jsonl --queries 0", "argument --queries: invalid positive integer"),
    ("bench --data q.jsonl --out q.jsonl", "--out q.jsonl: is a file, not a folder"),
    ("bench --data q.jsonl --peer-python missing/python", "--peer-python missing/python: no such file"),
    # capacity
    ("capacity --bench missing.json", "--bench missing.json: not a readable bench.json"),
    ("capacity --bench q.jsonl --p99 0", "--rates and --p99 must be positive"),
    # index
    ("index --db x.db --data missing.jsonl", "--data missing.jsonl: no such file"),
    ("index --db nodir/x.db --data q.jsonl", "--db nodir/x.db: no folder nodir"),
    ("index --db x.db --data q.jsonl --chunk-tokens 0", "argument --chunk-tokens: invalid positive integer"),
    # ask
    ("ask --db missing.db --question q", "missing.db: no such Milvus Lite database"),
    ("ask --db x.db --question ' '", "--question is empty"),
    ("ask --db x.db --question q --threshold 2", "threshold must be in [0, 1]"),
    ("ask --db x.db --question q --k 0", "argument --k: invalid positive integer"),
    # test-checkpoint
    ("test-checkpoint --family nope --out tc", "unknown family 'nope'"),
    ("test-checkpoint --out q.jsonl/tc", "--out q.jsonl/tc: q.jsonl is a file, not a folder"),
    # prune itself
    ("nope", "invalid choice: 'nope'"),
    ("run --no-such-flag", "prune run: error: unrecognized arguments: --no-such-flag (prune run --help"),
    ("index --dbb x.db --data q.jsonl", "required: --db; did you mean --db (not --dbb)?"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with the files CASES name, as the current folder; a model export or load
    on first use (the default model, the retrieval encoder) fails the test."""
    (tmp_path / "q.jsonl").write_text(BATCH + "\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not UTF-8")
    (tmp_path / "cut.jsonl").write_text(BATCH[:-1] + "\n")
    (tmp_path / "tab.jsonl").write_text('"one"\n\n{"text": "a\tb"}\n')  # a tab inside a string (line 3)
    (tmp_path / "passages.jsonl").write_text('{"text": "It was built in 1923."}\n"It holds 80,000."\n')
    (tmp_path / "plain.txt").write_text("The stadium was built in 1923.\nIt holds 80,000 people.\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRUNE_CACHE", str(tmp_path / "cache"))

    def no_model(*args, **kwargs):
        raise AssertionError("a model was exported or loaded before the input was checked")

    import engine.models.default_model
    import engine.rag.embedder

    monkeypatch.setattr(engine.models.default_model, "ensure_default_model", no_model)
    monkeypatch.setattr(engine.rag.embedder, "ensure_default_encoder", no_model)
    return tmp_path


def _run(words: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(words)
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    return code, capsys.readouterr().err


def test_every_subcommand_is_walked():
    walked = {c.split()[0] for c, _ in CASES}
    assert {m.__name__.rsplit(".", 1)[1].replace("_", "-") for m in COMMANDS} <= walked


@pytest.mark.parametrize("command,message", CASES, ids=[c for c, _ in CASES])
def test_an_input_error_is_one_line_and_exit_2(command, message, workdir, capsys):
    import shlex

    code, err = _run(shlex.split(command), capsys)
    assert "Traceback" not in err, err
    assert code == 2 and len(err.splitlines()) == 1 and message in err, (code, err)
    assert err.startswith("prune") and ": error: " in err, err


def test_a_real_process_prints_one_line_too(tmp_path):
    """The issue's case: `prune fidelity --data missing.jsonl` printed a traceback (exit 1)."""
    prune = Path(sys.executable).parent / "prune"
    out = subprocess.run(
        [str(prune), "fidelity", "--model", "m", "--data", "missing.jsonl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stderr) == (2, "prune fidelity: error: --data missing.jsonl: no such file\n")


def test_no_parser_of_prune_takes_an_abbreviation():
    """Every parser (prune's and each subcommand's) refuses an abbreviated option: argparse's
    default took `prune run --text x` as `--text-model x` and ran without the passage."""
    from engine.cli import build_parser

    top = build_parser()
    parsers = {"prune": top, **top.commands}
    assert set(top.commands) >= {m.__name__.rsplit(".", 1)[1].replace("_", "-") for m in COMMANDS}
    for name, parser in parsers.items():
        assert parser.allow_abbrev is False, name
        for action in parser._actions:
            for option in action.option_strings:
                short = option[:-1]
                if not option.startswith("--") or len(short) < 3 or short in parser._option_string_actions:
                    continue
                # argparse's own lookup of an option word: None or several matches, never this option
                found = parser._parse_optional(short)
                assert found is None or found[0] is None or found[0] is not action, (name, short, option)


def test_a_help_names_backend_only_where_the_command_takes_it():
    """`prune compress --help` said "with --backend torch" (the shared --device help), an option
    compress refuses, as does bench: a subcommand's help names --backend only where it has one, or
    as another command's (`prune run --backend ...`); compress's says how its model runs instead."""
    import re

    from engine.cli import build_parser

    for name, parser in build_parser().commands.items():
        text = " ".join(parser.format_help().split())
        own = [m for m in re.findall(r"(prune [\w-]+ )?--backend", text) if not m]
        assert "--backend" in parser._option_string_actions or not own, (name, text)
    compress = " ".join(build_parser().commands["compress"].format_help().split())
    assert "a checkpoint runs in PyTorch on the CPU" in compress, compress


def test_prune_run_with_an_abbreviation_exits_2_and_runs_nothing(workdir, capsys, monkeypatch):
    """The issue's case, end to end: `prune run --text "x"` exits 2 before any model is loaded."""
    code, err = _run(["run", "--question", "q", "--context", "c", "--text", "x"], capsys)
    assert code == 2 and "unrecognized arguments: --text x" in err, (code, err)


@pytest.mark.parametrize(
    "flag,value", [("--lexical-weight", 0.0), ("--threshold", 0.0), ("--passage-margin", 0.0)]
)
def test_a_zero_option_is_a_value_not_unset(flag, value):
    """`prune run --lexical-weight 0` is the model alone, not the model's default (0 was
    dropped as if unset)."""
    from engine.cli import build_parser
    from engine.cli.flags import call_options

    args = build_parser().parse_args(["run", "--question", "q", "--context", "c", flag, "0"])
    assert getattr(call_options(args), flag[2:].replace("-", "_")) == value


def test_a_file_error_no_check_foresaw_is_one_line_too(workdir, capsys, monkeypatch):
    """A disk that fills, a file removed between the check and its use: main() reports any
    OSError as the checks do (a traceback only with -v)."""
    import engine.cli.capacity

    def fails(args):
        raise PermissionError(13, "Permission denied", "out/r.jsonl")

    monkeypatch.setattr(engine.cli.capacity, "run", fails)
    code, err = _run(["capacity", "--bench", "b.json"], capsys)
    assert (code, err) == (2, "prune capacity: error: [Errno 13] Permission denied: 'out/r.jsonl'\n")


@pytest.mark.parametrize(
    "command",
    [
        "run --device cuda --question q --context c",
        "api --device cuda",
        "run --model default --device cuda --question q --context c",
    ],
)
def test_device_cuda_without_the_cuda_provider_is_one_line_before_any_export(
    command, workdir, capsys, monkeypatch
):
    # where ONNX Runtime has no CUDA provider (the CPU build), --device cuda says what to install,
    # before the default model is exported (workdir fails the test on any export)
    import shlex
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    code, err = _run(shlex.split(command), capsys)
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert "needs ONNX Runtime's CUDA provider: pip install 'prune-engine[gpu]'" in err, err


def test_a_taken_http_port_is_one_line_before_the_model_loads(workdir, capsys):
    """`prune api --port P` with P taken: one line and exit 2 before the default model is
    exported or loaded (the fixture fails the test if it is), not uvicorn's Errno 98 after."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _run(["api", "--port", str(port)], capsys)
    assert (code, err) == (
        2,
        f"prune api: error: --port {port}: 127.0.0.1:{port} is in use; choose another port\n",
    )


def test_prune_serve_checks_its_ports_before_tritonserver_starts(workdir, capsys, monkeypatch):
    """`prune serve` with a port named twice or taken: one line and exit 2 before tritonserver
    starts (the server's start fails the test), for tritonserver's ports and the HTTP API's."""
    import socket
    from engine.triton import server as triton_server

    monkeypatch.setattr(
        triton_server.TritonServer, "start", lambda *a, **k: pytest.fail("tritonserver started")
    )
    (Path("folder") / "demo_text").mkdir()  # a repository with a text model: the API is on
    (Path("folder") / "demo_text" / "config.pbtxt").write_text('name: "demo_text"\n')
    code, err = _run(
        ["serve", "--model-repository", "folder", "--http-port", "9100", "--grpc-port", "9100"], capsys
    )
    assert (code, err.splitlines()[-1]) == (
        2,
        "prune serve: error: --http-port and --grpc-port are both 9100: each server needs a port of its own",
    ), err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag in ("--grpc-port", "--api-port"):
            code, err = _run(["serve", "--model-repository", "folder", flag, str(port)], capsys)
            assert (code, err.splitlines()[-1]) == (
                2,
                f"prune serve: error: {flag} {port}: 127.0.0.1:{port} is in use; choose another port",
            ), err
