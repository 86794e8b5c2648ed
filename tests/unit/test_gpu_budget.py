"""benchmarks/gpu.py when its budget runs out during the exports (#55: on the first H200 run
the exports used up the engine's share, and the report was lost): the exports are stopped
at the budget and their processes gone, and gpu.json and gpu.md still list what was done
(the checkpoints), each export's time so far, and every case not measured, with the reason.
`prune export` is made slow here (a process that sleeps in its place), so the budget always
runs out during it; tests/packaging/test_gpu_script.py runs the real exports."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import write_tiny_data

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped by a parent) is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_budget_spent_during_the_exports_still_reports(tmp_path):
    pids = tmp_path / "pids"
    (tmp_path / "data").mkdir()
    rag = write_tiny_data(tmp_path / "data") / "rag.jsonl"
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    args = [
        "--tiny",
        "--device",
        "cpu",
        "--budget-s",
        "8",
        "--lengths",
        "32",
        "--batches",
        "1",
        "--cut-shapes",
        "1x32",
        "--compile-shapes",
        "1x32",
        "--iters",
        "1",
        "--compile-backend",
        "aot_eager",
        "--fp32",
        "--rag-data",
        str(rag),
        "--bench-reserve-s",
        "2",
        "--bench-min-s",
        "1",
        "--keep",
        str(tmp_path / "models"),
        "--out",
        str(out),
        "--markdown",
        str(md),
    ]
    # benchmarks.gpu in a process of its own, its `prune export` a process that says its pid and sleeps
    fake = tmp_path / "fake_export.py"
    fake.write_text(
        f"import os, time\nwith open({str(pids)!r}, 'a') as fh:\n    fh.write(f'{{os.getpid()}}\\n')\n"
        "time.sleep(300)\n"
    )
    script = (
        f"import sys\nfrom benchmarks.gpu_run import models\n"
        f"models.export_command = lambda ck, out, p: [sys.executable, {str(fake)!r}]\n"
        f"from benchmarks import gpu\nsys.exit(gpu.main({args!r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the exports were stopped at the budget (8 s), far before their 300 s; a busy machine adds its
    # own seconds (24 s seen beside a full suite), so the margin is wide
    assert json.loads(out.read_text())["info"]["elapsed_s"] < 8 + 60
    started = [int(p) for p in pids.read_text().split()]
    left = [p for p in started if alive(p)]
    for pid in left:  # none should be: leave nothing behind either way
        os.kill(pid, signal.SIGKILL)
    assert 1 <= len(started) <= 2 and not left  # the full model's fp16 export, and the cut's if it began
    rows = json.loads(out.read_text())["rows"]
    # what was done: the checkpoints, and each export's time until it was stopped
    assert [(r["model"], r["reused"]) for r in rows if r.get("kind") == "checkpoint"] == [
        ("2 layers", False),
        ("1-layer cut", False),
    ]
    exports = {(r["model"], r["precision"]): r for r in rows if r.get("kind") == "export"}
    full = exports[("2 layers", "fp16")]  # begun at once, in the background
    assert full["skipped"].startswith("stopped after ") and full["skipped"].endswith("the budget was spent")
    assert full["seconds"] > 0 and full["background"]
    cut = exports[("1-layer cut", "fp16")]  # begun after the checkpoints, if the budget still allowed
    assert (
        cut["skipped"] == "not started: the budget was spent"
        if len(started) == 1
        else (cut["skipped"].startswith("stopped after ") and cut["seconds"] > 0)
    ), cut
    # fp32 (asked for) never started: the budget was spent before its turn
    assert exports[("2 layers", "fp32")]["skipped"] == "not started: the budget was spent"
    # what was not measured, and why: the engine's rows for want of their exports; the PyTorch peers'
    # shapes measured while an export ran (the GPU idle) until the budget was spent, the rest not
    skipped = {
        (r.get("model"), r.get("path")): r["skipped"] for r in rows if "skipped" in r and "kind" not in r
    }
    assert skipped[("1-layer cut", "onnxruntime-cpu fp16")] == f"no fp16 export ({cut['skipped']})"
    assert skipped[("2 layers", "onnxruntime-cpu fp16")].startswith("no fp16 export (stopped after ")
    assert (
        skipped[("2 layers", "onnxruntime-cpu fp32")] == "no fp32 export (not started: the budget was spent)"
    )
    for model in ("1-layer cut", "2 layers"):
        for path in ("torch eager fp16", "torch.compile fp16", "torch eager fp32", "torch.compile fp32"):
            (row,) = [r for r in rows if (r.get("model"), r.get("path")) == (model, path)]
            assert "ms_per_batch" in row or row["skipped"].startswith("not started: the budget was spent"), (
                row
            )
            assert "ms_per_batch" not in row or row["beside_export"], row
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    report = json.loads(out.read_text())
    assert report["bench"]["status"] == "prune bench not run: no fp16 export of the full model"
    # gpu.md: well-formed, with the export times and the reasons
    text = md.read_text()
    tables = [block.strip().splitlines() for block in text.split("\n\n") if block.startswith("|")]
    assert tables and all(len({line.count("|") for line in t}) == 1 for t in tables), text
    assert "| 2 layers | export | fp16 |" in text and "not finished: stopped after" in text
    assert (
        "## Not measured" in text
        and "- 2 layers onnxruntime-cpu fp16: no fp16 export (stopped after " in text
    )
    assert "prune bench not run: no fp16 export of the full model" in text


def test_an_export_of_the_same_checkpoint_is_reused(tmp_path):
    """An export is reused (not run again, and said so) only where its manifest names the same
    checkpoint, the same weights and the same precision, and its graph is there."""
    from benchmarks.gpu_run.models import Export, not_reusable, weights_sha256

    ck, out = tmp_path / "checkpoint", tmp_path / "fp16"
    ck.mkdir()
    out.mkdir()
    (ck / "model.safetensors").write_bytes(b"weights")
    (out / "model.onnx").write_bytes(b"graph")
    manifest = {
        "format": "prune-engine/1",
        "precision": "fp16",
        "graph": "model.onnx",
        "source": {"checkpoint": str(ck.resolve()), "weights_sha256": weights_sha256(ck)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    said: list[str] = []
    export = Export("24 layers", ck, out, "fp16", tmp_path / "logs", said.append).begin()
    assert export.reused and export.ready and export.proc is None and not (tmp_path / "logs").exists()
    assert said == [
        f"24 layers fp16: reusing the export in {out} (its manifest names the same checkpoint, weights "
        "and precision): not exported again"
    ]
    row = export.row()
    assert row["reused"] and "same checkpoint" in row["reused_because"] and "skipped" not in row
    assert not_reusable(out, ck, "fp32") == "its precision is fp16"
    assert not_reusable(out, tmp_path, "fp16").startswith("it was exported from ")
    (ck / "model.safetensors").write_bytes(b"other weights")
    assert not_reusable(out, ck, "fp16") == "the checkpoint's weights changed since"
    (out / "model.onnx").unlink()
    assert not_reusable(out, ck, "fp16") == "its graph is missing"
    (out / "manifest.json").write_text("{")
    assert not_reusable(out, ck, "fp16").startswith("unreadable manifest")
    assert not_reusable(tmp_path / "nothing", ck, "fp16") == "no export there"
