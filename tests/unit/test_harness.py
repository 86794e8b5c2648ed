"""What the benchmarks share (engine/bench/harness.py, engine/machine/timing.py): every kept
benchmark writes its report with the harness and is indexed; one that reads the default
model names the precision it needs; a benchmark run as a module writes its command (rebuilt
from its own argv), the machine and its figures; medians and interleaved rounds."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.machine.timing import interleave, medians
from engine.bench.harness import Study
from engine.machine.describe import machine_line

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: the benchmarks a user or maintainer runs (benchmarks/, dev/), and the converter that builds a RAG file
KEPT = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "dev").glob("*.py")])
SCRIPTS = [p for p in KEPT if p.stem not in ("__init__", "rag_from_prune")]


def harness_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "engine.bench.harness"
        for a in node.names
    }


def test_the_kept_benchmarks_are_these():
    assert {p.stem for p in SCRIPTS} == {"gpu", "retrieval", "profile_ops"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_runs_on_the_harness_and_is_indexed(path):
    names = harness_names(path)
    if path.stem == "gpu":  # a budgeted run that saves its JSON after every case (gpu.sh reads it)
        assert "engine.machine.describe" in path.read_text()
    else:
        assert "Study" in names, f"{path.name} writes its report without the harness's Study"
        assert "argparse.ArgumentParser(" not in path.read_text(), (
            "a benchmark's flags come from harness.parser"
        )
    assert f"`{path.parent.name}/{path.name}`" in (ROOT / "benchmarks" / "README.md").read_text(), (
        f"{path.name} is missing from benchmarks/README.md"
    )


def unpinned_default_models(path: Path) -> list[int]:
    """Lines where a script asks for the default model without naming its precision."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "ensure_default_model"
        and not any(k.arg == "precision" for k in node.keywords)
    ]


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.stem)
def test_a_benchmark_names_the_default_models_precision(path):
    """The default model's folder is auto's pick on the machine that runs it (an OpenVINO IR
    on an AMX Xeon): a script that reads its graph as ONNX asks for the precision it needs."""
    assert not unpinned_default_models(path), (
        f"{path.name} calls ensure_default_model() without precision= (lines {unpinned_default_models(path)})"
    )


def test_a_benchmark_run_as_a_module_writes_its_command_machine_and_figures(tmp_path):
    # a tiny benchmark in a package of its own, run as `python -m`, as retrieval.py and profile_ops.py run
    package = tmp_path / "tinybench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sleep.py").write_text(
        "from engine.machine.timing import interleave, medians\n"
        "from engine.bench.harness import Study, parser\n"
        "import time\n"
        "a = parser('Sleeps.').parse_args()\n"
        "study = Study('sleep', 'tinybench.sleep')\n"
        "seconds = interleave({'short': lambda: time.sleep(0.001), 'long': lambda: time.sleep(0.002)}, a.repeats)\n"
        "rows = [f'| {k} | {v * 1000:.1f} |' for k, v in medians(seconds).items()]\n"
        "study.write(a.out, {'seconds': seconds}, study.header('Sleep', f'medians of {a.repeats} rounds.') + rows)\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, "-m", "tinybench.sleep", "--repeats", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "sleep.json").read_text())
    assert doc["command"] == f"python -m tinybench.sleep --repeats 3 --out {out}"
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["python"] and doc["date"]
    assert all(len(v) == 3 for v in doc["seconds"].values())
    md = (out / "sleep.md").read_text()
    assert doc["command"] in md and machine_line(doc["machine"]) in md and "medians of 3 rounds." in md
    assert proc.stderr.count("round ") == 6  # progress on stderr, the report on stdout
    assert "| short |" in proc.stdout and "| long |" in proc.stdout


def test_the_report_writer_and_medians(tmp_path):
    study = Study("x", "benchmarks.x", ["--a", "b c"])
    assert study.command == "python -m benchmarks.x --a 'b c'"
    md = study.write(tmp_path, {"value": 1}, study.header("Title", "How.") + ["| a |"], echo=False)
    assert md.read_text().startswith("# Title\n\n```\npython -m benchmarks.x --a 'b c'\n```\n\nMachine: ")
    assert json.loads((tmp_path / "x.json").read_text())["value"] == 1
    assert medians({"a": [3.0, 1.0, 2.0], "b": [4.0, 1.0]}) == {"a": 2.0, "b": 2.5}
    order = []
    interleave(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3, log=lambda m: None, warmup=True
    )
    assert order == ["a", "b"] * 4  # a warm-up round, then 3 rounds, each variant once a round
