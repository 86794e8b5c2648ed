"""Every study under benchmarks/ runs on the shared harness (engine/tools/harness.py) and is
indexed in benchmarks/README.md; a small study runs end to end and writes its report."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tools.harness import Study, interleave, machine_line, medians

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
#: not a study: the converter that builds a RAG file
NOT_STUDIES = {"__init__", "rag_from_prune"}
STUDIES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in NOT_STUDIES)


def harness_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "engine.tools.harness" for a in node.names}


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_runs_on_the_harness_and_is_indexed(study):
    names = harness_names(BENCH / f"{study}.py")
    if study == "gpu":       # a budgeted run that saves its JSON after every case (gpu.sh reads it)
        assert {"machine_info", "stderr"} <= names
    else:
        assert "Study" in names, f"benchmarks/{study}.py writes its report without the harness's Study"
    source = (BENCH / f"{study}.py").read_text()
    assert "argparse.ArgumentParser(" not in source or study == "gpu", "a study's flags come from harness.parser"
    assert f"`{study}.py`" in (BENCH / "README.md").read_text(), f"{study}.py is missing from the index"


def unpinned_default_models(path: Path) -> list[int]:
    """Lines where a study asks for the default model without naming its precision."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "ensure_default_model"
            and not any(k.arg == "precision" for k in node.keywords)]


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_names_the_default_models_precision(study):
    """The default model's folder is auto's pick on the machine that runs it (an OpenVINO IR
    on an AMX Xeon): a study that reads its graph as ONNX asks for the precision it needs."""
    assert not unpinned_default_models(BENCH / f"{study}.py"), (
        f"benchmarks/{study}.py calls ensure_default_model() without precision= "
        f"(lines {unpinned_default_models(BENCH / f'{study}.py')})")


def test_a_study_writes_its_command_machine_and_figures(tmp_path):
    out = tmp_path / "ln"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.layer_norm", "--rows", "64", "--hidden", "32",
                           "--repeats", "3", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "layer-norm.json").read_text())
    assert doc["command"] == ("python -m benchmarks.layer_norm --rows 64 --hidden 32 --repeats 3 --threads 1 "
                              f"--out {out}")
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["python"]
    assert all(len(v) == 3 for v in doc["seconds"].values()) and doc["max_abs_difference"] < 1e-4
    md = (out / "layer-norm.md").read_text()
    assert doc["command"] in md and machine_line(doc["machine"]) in md
    assert "| SkipLayerNormalization |" in md and "medians of 3 interleaved rounds" in md
    assert proc.stderr.count("round ") == 6          # progress on stderr, the report on stdout
    assert "| Add + LayerNormalization |" in proc.stdout


def test_the_study_writer_and_medians(tmp_path):
    study = Study("x", "benchmarks.x", ["--a", "b c"])
    assert study.command == "python -m benchmarks.x --a 'b c'"
    md = study.write(tmp_path, {"value": 1}, study.header("Title", "How.") + ["| a |"], echo=False)
    assert md.read_text().startswith("# Title\n\n```\npython -m benchmarks.x --a 'b c'\n```\n\nMachine: ")
    assert json.loads((tmp_path / "x.json").read_text())["value"] == 1
    assert medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
    order = []
    interleave({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3, log=lambda m: None, abba=True)
    assert order == ["a", "b", "b", "a", "a", "b"]
