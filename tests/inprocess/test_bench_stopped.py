"""`prune bench` stopped early writes what it measured (#55: the first GPU run's bench, stopped
at its budget by `timeout`, wrote nothing): SIGTERM in the middle of its rounds, or its
--budget-s spent, and bench.json and bench.md still hold every repeat that ended, say that
it stopped, and which paths were not measured and why."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils import write_tiny_data

pytestmark = pytest.mark.inprocess

ROOT = Path(__file__).resolve().parents[2]


def bench(tmp_path: Path, model: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "data").mkdir()
    data = write_tiny_data(tmp_path / "data") / "rag.jsonl"
    log = tmp_path / "bench.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine",
                "bench",
                "--data",
                str(data),
                "--model",
                str(model),
                "--queries",
                "2",
                "--threads",
                "1",
                "--out",
                str(tmp_path / "out"),
                *extra,
            ],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def report(tmp_path: Path) -> tuple[dict, str]:
    (folder,) = (tmp_path / "out").glob("bench-*")
    return json.loads((folder / "bench.json").read_text()), (folder / "bench.md").read_text()


def test_sigterm_in_the_rounds_keeps_the_repeats_that_ended(exported, tmp_path):
    proc, log = bench(tmp_path, exported["provence"], "--repeats", "500", "--paths", "^onnxruntime-fp32")
    deadline = time.monotonic() + 120
    while "round 3/500" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert "round 3/500" in log.read_text(), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    rep, md = report(tmp_path)
    assert rep["stopped"] == "SIGTERM"
    done = {r["path"]: r["repeats"] for r in rep["paths"]}
    assert set(done) == {"onnxruntime-fp32", "onnxruntime-fp32, fixed batches of 8 in input order"}
    assert all(2 <= n < 500 for n in done.values()) and all(r["passages_per_s"] > 0 for r in rep["paths"])
    assert rep["limits"] == {"skipped": "prune bench stopped early (SIGTERM)"}
    assert "**Stopped early**: SIGTERM" in md and "| onnxruntime-fp32 |" in md
    assert "stopped early: SIGTERM" in log.read_text()


def test_a_spent_budget_lists_what_was_not_measured(exported, tmp_path):
    not_a_checkpoint = tmp_path / "not-a-checkpoint"  # a folder without a model: torch fails to start
    not_a_checkpoint.mkdir()
    proc, log = bench(
        tmp_path,
        exported["provence"],
        "--repeats",
        "100000",
        "--budget-s",
        "4",
        "--checkpoint",
        str(not_a_checkpoint),
        "--paths",
        "^onnxruntime-fp32$|^torch-batched$",
    )
    assert proc.wait(120) == 0, log.read_text()[-3000:]
    rep, md = report(tmp_path)
    assert rep["stopped"] == "its budget of 4 s was spent"
    assert [r["path"] for r in rep["paths"]] == ["onnxruntime-fp32"] and rep["paths"][0]["repeats"] >= 1
    # the torch path could not start (no checkpoint there): a reason in the report, not a crash
    assert rep["not_measured_reasons"]["torch-batched"].startswith("failed to start:")
    assert "- torch-batched: failed to start:" in md and "budget of 4 s" in md
