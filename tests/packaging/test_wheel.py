"""The built wheel carries what `prune repository` needs (the python-backend templates),
and a repository written from the installed files, outside the source tree, is whole."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.utils import free_ports, fresh_venv

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(tmp_path: Path) -> Path:
    """The wheel built from a copy of the tree without build outputs (setuptools reuses a stale
    build/ folder, which would hide what a fresh clone's wheel holds)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "results"
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next(dist.glob("prune_engine-*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built once for this module's tests."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_the_templates_and_repository_works_from_it(exported, wheel, tmp_path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "triton_models/python_core/model.py",
        "triton_models/python_text/model.py",
        "triton_models/python_compress/model.py",
        "engine/py.typed",
        "engine/http/proto/model_service.proto",
    } <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (
        "import sys, triton_models, engine; "
        f"assert triton_models.__file__.startswith({str(site)!r}), triton_models.__file__; "
        "from engine.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "repository", "--model", str(exported["opensearch"]), "--out", "repo"],
        cwd=work,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for model in ("opensearch", "opensearch_text"):
        assert (work / "repo" / model / "1" / "model.py").is_file()
    assert (work / "repo" / "opensearch_text" / "1" / "tokenizer.json").is_file()
    proto = subprocess.run(
        [
            sys.executable,
            "-c",
            "from engine.http.milvus import proto_modules; "
            "print(proto_modules()[0].HighlightResult.DESCRIPTOR.full_name)",
        ],
        cwd=work,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proto.stdout.strip() == "milvus.proto.modelservice.HighlightResult", (
        proto.stderr
    )  # the model service's


def _wait_for_line(proc, needle: str, timeout: float) -> str:
    """Read the process's stdout until a line holds `needle` (a thread, so a silent process times out)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no {needle!r} within {timeout} s; output:\n" + "".join(seen))


def test_wheel_in_a_fresh_venv_runs_the_whole_first_use_path(checkpoints, wheel, tmp_path):
    """What a user of the wheel does, outside the source tree, with the extras docs/installing.md names:
    the default model on first use, an export, a repository, a served model and a client run."""
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "LICENSE missing from the wheel"
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n} == {
        "engine",
        "export",
        "triton_models",
    }, "the wheel installs top-level names beyond the layout"
    assert (
        "engine/evaluate/quality.py" in names and "engine/fidelity_check.py" in names
    )  # prune eval / fidelity

    venv = tmp_path / "venv"
    fresh_venv(venv, f"{wheel}[cpu,default-model,triton,serve,api]")
    prune = str(venv / "bin" / "prune")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PRUNE_CACHE": str(tmp_path / "cache"),
    }

    def prune_cmd(*args, timeout=300):
        proc = subprocess.run(
            [prune, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"prune {' '.join(args)}:\n{proc.stderr[-3000:]}"
        return proc

    first = prune_cmd(
        "run",
        "--question",
        "What goes on the bottom of Shepherd's pie?",
        "--context",
        "Shepherd's pie has minced lamb at the bottom. Mashed potato goes on top. It is baked in an oven.",
    )
    assert "first use: exporting the default model" in first.stderr  # as --precision auto picks
    assert ".tmp-" not in first.stderr and "auto: picked " in first.stderr
    assert "; wrote " + str(tmp_path / "cache") in first.stderr
    assert "pruned_context:\nShepherd's pie has minced lamb at the bottom." in first.stdout, first.stdout
    prune_cmd("export", "--model", str(checkpoints["opensearch"]), "--out", "exported")
    prune_cmd(
        "repository",
        "--target",
        "cpu",
        "--model",
        "exported",
        "--name",
        "hl",
        "--out",
        "repo",
        "--text-instances",
        "1",
    )
    http, grpc, metrics, api = free_ports(4)
    serve = subprocess.Popen(
        [
            prune,
            "serve",
            "--model-repository",
            "repo",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--api-port",
            str(api),
        ],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        _wait_for_line(serve, "HTTP API ready", 180)
        served = prune_cmd(
            "run",
            "--server",
            f"127.0.0.1:{grpc}",
            "--text-model",
            "hl_text",
            "--json",
            "--question",
            "what is at the bottom?",
            "--context",
            "Lamb is at the bottom. Potato is on top.",
        )
        local = prune_cmd(
            "run",
            "--model",
            "exported",
            "--json",
            "--question",
            "what is at the bottom?",
            "--context",
            "Lamb is at the bottom. Potato is on top.",
        )
        got, want = json.loads(served.stdout), json.loads(local.stdout)
        assert [s["text"] for s in got[0]["sentences"]] == [s["text"] for s in want[0]["sentences"]]
        assert got[0]["pruned_context"] == want[0]["pruned_context"]
        request = urllib.request.Request(
            f"http://127.0.0.1:{api}/v1/prune",
            headers={"Content-Type": "application/json"},
            data=json.dumps(
                {
                    "question": "what is at the bottom?",
                    "passages": ["Lamb is at the bottom. Potato is on top."],
                }
            ).encode(),
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            assert json.load(r)["results"][0]["pruned_context"] == want[0]["pruned_context"]
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0


def _venv_with(wheel: Path, extras: str, tmp_path: Path, *also: str) -> Path:
    """A fresh venv with `wheel[extras]` (and the requirements `also`) from the package index."""
    venv = tmp_path / "venv"
    fresh_venv(venv, f"{wheel}[{extras}]", *also)
    return venv


def test_cpu_extra_alone_runs_the_main_job_on_numpy_2(exported, pruners, wheel, tmp_path):
    """`pip install prune-engine[cpu]` (no torch, no Triton): numpy 2 is what resolves, an
    exported model runs in-process as in the dev environment, and what needs another extra
    says which."""
    venv = _venv_with(wheel, "cpu", tmp_path)
    py = str(venv / "bin" / "python")
    numpy = subprocess.run(
        [py, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True
    )
    assert int(numpy.stdout.split(".")[0]) >= 2, numpy.stdout
    for absent in ("torch", "transformers", "tritonclient"):
        assert subprocess.run([py, "-c", f"import {absent}"], capture_output=True).returncode != 0, absent
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PRUNE_CACHE": str(tmp_path / "cache"),
    }
    question, passage = (
        "When was the stadium built?",
        "The stadium was built in 1923. It holds 80,000 people.",
    )

    def prune(*args):
        return subprocess.run(
            [str(venv / "bin" / "prune"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    run = prune(
        "run", "--model", str(exported["provence"]), "--json", "--question", question, "--context", passage
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)[0]
    want = pruners["provence"][0].prune(question, [passage])[0]
    assert [s["text"] for s in got["sentences"]] == [s.text for s in want.sentences]
    assert [s["probability"] for s in got["sentences"]] == pytest.approx(
        [s.probability for s in want.sentences], abs=1e-5
    )
    export = prune("export", "--model", str(exported["provence"]), "--out", "x")
    assert export.returncode == 2 and "pip install 'prune-engine[export]'" in export.stderr, export.stderr
    assert "Traceback" not in export.stderr
    default = prune("run", "--question", question, "--context", passage)
    assert default.returncode == 2 and "pip install 'prune-engine[default-model]'" in default.stderr, (
        default.stderr
    )


CLIENT_SCRIPT = r"""
import json, sys
from engine.pruner import Pruner
url, http_url = sys.argv[1], sys.argv[2]
q = "When was the stadium built?"
docs = ["The stadium was built in 1923. It holds 80,000 people.", "Paris is the capital of France.", ""]
out = {}
for name, target, kw in [("text-grpc", url, {}), ("text-http", http_url, {"protocol": "http"}),
                         ("core-grpc", url, {})]:
    with Pruner.connect(target, "xprovence" if name == "core-grpc" else "xprovence_text", **kw) as p:
        out[name] = [r.to_dict() for r in p.prune(q, docs)]
import google.protobuf, numpy, tritonclient
print(json.dumps({"results": out, "versions": {"protobuf": google.protobuf.__version__, "numpy": numpy.__version__}}))
"""


def test_the_newest_tritonclient_on_numpy_2_talks_to_the_bundled_server(wheel, server, pruners, tmp_path):
    """`[cpu,triton]` alone resolves the newest tritonclient with protobuf 5+ and numpy 2;
    the text model (gRPC and HTTP) and the core model on the bundled 2.51 server answer it
    as the in-process pruner does. (Only perf_analyzer, installed apart, needs the 2.51 wheel.)"""
    venv = _venv_with(wheel, "cpu,triton", tmp_path)
    py = str(venv / "bin" / "python")
    version = subprocess.run(
        [py, "-c", "import importlib.metadata as m; print(m.version('tritonclient'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert tuple(int(x) for x in version.split(".")[:2]) > (2, 51), version
    run = subprocess.run(
        [py, "-c", CLIENT_SCRIPT, server.grpc_url, server.http_url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert int(report["versions"]["numpy"].split(".")[0]) >= 2
    assert int(report["versions"]["protobuf"].split(".")[0]) >= 5, report["versions"]
    want = pruners["xprovence"][0].prune(
        "When was the stadium built?",
        ["The stadium was built in 1923. It holds 80,000 people.", "Paris is the capital of France.", ""],
    )
    for name, got in report["results"].items():
        assert [g["pruned_context"] for g in got] == [w.pruned_context for w in want], name
        for g, w in zip(got, want):
            assert [s["probability"] for s in g["sentences"]] == pytest.approx(
                [s.probability for s in w.sentences], abs=1e-4
            ), name


def test_what_the_image_installs_runs_the_api_in_front_of_a_text_model(wheel, server, pruners, tmp_path):
    """deploy/Dockerfile's install ([api,triton] and numpy<2, its check command) in a fresh
    venv, then its API container's command (`prune api --server`, deployment.yaml) in front
    of a served text model: /v1/prune and /health answer as the in-process pruner does."""
    import re

    dockerfile = (Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile").read_text()
    extras = re.search(r'prune_engine-\*\.whl\)\[([a-z,]+)\]" "(numpy<2)"', dockerfile)
    check = re.search(r'python3 -c "([^"]+)"', dockerfile).group(1)
    assert extras, "the Dockerfile's install line changed: update this test"
    venv = _venv_with(wheel, extras.group(1), tmp_path, extras.group(2))
    assert subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True).returncode == 0
    (port,) = free_ports(1)
    api = subprocess.Popen(
        [
            str(venv / "bin" / "prune"),
            "api",
            "--server",
            server.grpc_url,
            "--text-model",
            "xprovence_text",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_line(api, "Uvicorn running", 120)
        q, docs = (
            "When was the stadium built?",
            ["The stadium was built in 1923. It holds 80,000 people.", ""],
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/prune",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"question": q, "passages": docs}).encode(),
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            got = json.load(r)["results"]
        assert [g["pruned_context"] for g in got] == [
            w.pruned_context for w in pruners["xprovence"][0].prune(q, docs)
        ]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
            assert r.status == 200
    finally:
        api.send_signal(signal.SIGTERM)
        # uvicorn drains, then re-raises the signal it caught (so a parent sees it): -15
        assert api.wait(timeout=60) == -signal.SIGTERM
