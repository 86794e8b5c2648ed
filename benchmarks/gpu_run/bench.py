"""The GPU run's last part: `prune bench` on the RAG workload (--rag-data) with the full
model's exports and checkpoint, as a process of its own within what is left of the budget
(its own --budget-s, and SIGTERM at the end of the run's: it then writes what it measured);
its bench.json and bench.md are copied beside the run's report and summed up in it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def bench_command(run, ck: Path, seconds: float) -> list[str]:
    """prune bench on the RAG workload with the full model's exports and checkpoint."""
    a = run.args
    on = "-cuda" if a.device == "cuda" else ""
    paths = a.bench_paths or (
        "^("
        + "|".join(
            [
                f"onnxruntime{on}-fp16",
                "torch-batched-fp16" if on else "torch-batched",
                "torch-compile-batched" + ("-fp16" if on else ""),
                # serving 16 concurrent RAG calls, merged against unmerged (prune api on the fp16 export)
                "api-in-process-c16-fp16",
                "api-in-process-c16-merged-fp16",
            ]
            + ([f"onnxruntime{on}-fp32"] + (["torch-batched"] if on else []) if a.fp32 else [])
        )
        + ")$"
    )
    ready = {e.precision: e for e in run.exports if e.label == run.full and e.ready}
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "bench",
        "--device",
        a.device,
        "--data",
        a.rag_data,
        "--queries",
        str(a.rag_queries),
        "--repeats",
        str(a.rag_repeats),
        "--fp16",
        str(ready["fp16"].out),
        "--checkpoint",
        str(ck),
        "--paths",
        paths,
        "--serving",
        "--compile-backend",
        a.compile_backend,
        "--budget-s",
        f"{seconds:.0f}",
        "--out",
        str(run.logs / "bench"),
    ]
    if "fp32" in ready:
        cmd += ["--model", str(ready["fp32"].out)]
    return cmd


def run_bench(run, ck: Path) -> None:
    """prune bench on --rag-data, within what is left of the budget; its bench.json and
    bench.md beside --out, its figures in the report."""
    a = run.args
    fp16 = next((e for e in run.exports if e.precision == "fp16" and e.label == run.full), None)
    left = run.budget.left()
    if fp16 is None or not fp16.ready:
        run.report["bench"] = {"status": "prune bench not run: no fp16 export of the full model"}
    elif left < a.bench_min_s:
        run.report["bench"] = {
            "status": f"prune bench not run: {left:.0f} s left of the budget (it needs {a.bench_min_s:.0f})"
        }
    else:
        cmd = bench_command(run, ck, left - 25)  # its imports and its report: about 25 s
        run.report["bench"] = {
            "status": f"prune bench started with {left:.0f} s left",
            "command": shlex.join(cmd),
        }
        run.save()
        run.logs.mkdir(parents=True, exist_ok=True)
        run.bench_began = time.time()
        with open(run.logs / "bench.log", "w") as fh:
            # the API processes capture each shape as the untimed first pass meets it, not all of them
            # at load (each capture at the full size takes seconds of the run's budget)
            env = {**os.environ, "PRUNE_GPU_WARM": "lazy"}
            run.bench_proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            run.bench_proc.wait(max(1.0, left - 8))
        except subprocess.TimeoutExpired:
            stop_bench(run, 12)
        read_bench(run)
    run.done("prune bench")
    run.save()


def stop_bench(run, seconds: float) -> None:
    """prune bench stopped: SIGTERM (it then writes what it measured), killed after `seconds`."""
    proc = run.bench_proc
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_bench(run) -> None:
    """prune bench's report, copied beside --out and summed up in the run's report (once)."""
    if run.bench_proc is None or run.report.get("bench", {}).get("read"):
        return
    run.report["bench"]["read"] = True
    folders = sorted(
        p for p in (run.logs / "bench").glob("bench-*") if p.stat().st_mtime >= run.bench_began - 1
    )
    found = folders[-1] / "bench.json" if folders else None
    bench = run.report["bench"]
    code = run.bench_proc.returncode if run.bench_proc is not None else None
    if found is None or not found.is_file():
        bench["status"] = f"prune bench wrote no report (exit status {code}; logs/bench.log says why)"
        return
    rep = json.loads(found.read_text())
    out = Path(run.args.out).parent
    for name in ("bench.json", "bench.md"):
        shutil.copy(found.parent / name, out / name)
    bench.update(
        status=f"prune bench: exit status {code}"
        + (f", stopped early: {rep['stopped']}" if rep.get("stopped") else ""),
        paths=[
            {
                k: r.get(k)
                for k in (
                    "path",
                    "passages_per_s",
                    "tokens_per_s",
                    "p50_ms",
                    "repeats",
                    "warmup_s",
                    "compile_s",
                )
            }
            for r in rep.get("paths", [])
        ],
        not_measured=rep.get("not_measured_reasons") or {},
    )
