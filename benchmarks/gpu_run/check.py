"""The GPU run's first step: whether the GPU graph's design holds on this GPU, in under 3
minutes, before anything is timed. Each check is a row (kind "check") with PASS, FAIL or
SKIP (on the CPU: what a CPU cannot show) and its figure, in gpu.json and gpu.md:

- capture: ONNX Runtime's own log (default logger at severity 1, stderr captured at the
  file descriptor) shows the CUDA graph captured and replayed;
- shared weights: the same log shows each session using every shared weight as given
  ("Using user supplied initializer"), none copied ("Cannot use user supplied initializer");
- fresh inputs: 50 calls with new random inputs at one captured shape against the
  dynamic (uncaptured) session of the same backend: max |dp| <= 0.02 and no two calls
  with the same outputs (a replay that read stale inputs would repeat them);
- threads: 4 threads x 20 calls on two captured shapes, each the outputs of its own
  inputs, no error;
- providers: one profiled run without CUDA graphs at a fixed shape: every node ran on the
  CUDA provider (ONNX Runtime's profile names each node's provider);
- memory: device memory after loading a 4-layer hidden-1024 model and after each of three
  more captured shapes, against one session made without the shared weights: the shared
  sessions add far less than a copy of the weights each;
- two models: a pruner and a compressor on the process's one GPU thread, one capturing while
  the other serves 100 calls (benchmarks/gpu_run/serving.py, which also has the full-size
  check gpu.py runs once the full model's export is done).

    python -m benchmarks.gpu_run.check --device cuda --out check.json     (gpu.py runs it first)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256}
WIDE = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "intermediate_size": 4096}
MAX_DPROB = 0.02


def export_fp16(folder: Path, sizes: dict) -> Path:
    """A Provence test checkpoint of `sizes` exported at fp16 (the GPU graph) into `folder`,
    reused when there; its graph."""
    graph = folder / "fp16" / "model.onnx"
    if graph.is_file():
        return graph
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    ck = make_test_checkpoint("provence", folder / "checkpoint", sizes=sizes)
    export_model(ck, folder / "fp16", precision="fp16", verify=False, overwrite=True, log=lambda m: None)
    return graph


def batch(rows: int, length: int, seed: int, vocab: int = 500):
    """A ModelBatch of random ids, a ragged mask and sentences of 16 tokens."""
    from engine.pipeline.encode import ModelBatch

    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(rows, length)).astype(np.int64)
    mask = np.ones_like(ids)
    for r in range(rows):
        mask[r, rng.integers(length // 2, length + 1) :] = 0
    sid = np.tile(np.arange(length) // 16, (rows, 1)).astype(np.int64)
    sid[mask == 0] = -1
    return ModelBatch(ids, mask, sid, np.zeros_like(ids), list(range(rows)))


@contextlib.contextmanager
def stderr_into(path: Path) -> Iterator[None]:
    """What this process writes to file descriptor 2 (ONNX Runtime's log among it) into `path`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as fh:
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def device_used() -> int | None:
    """Bytes in use on GPU 0 (torch's view of the driver's count, else nvidia-smi), or None."""
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(0)
            return int(total - free)
    except Exception:
        pass
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        return int(float(out.strip().splitlines()[0]) * 2**20)
    except Exception:
        return None


def row(check: str, result: str, figure: str, **extra: Any) -> dict:
    """A check's row for the report."""
    return {"kind": "check", "check": check, "result": result, "figure": figure, **extra}


def check_capture(graph: Path, device: str, work: Path) -> tuple[list[dict], Any]:
    """The capture and shared-weights checks (one log); their rows and the backend (4 x 128
    captured), kept for the next checks."""
    import onnxruntime as ort
    from engine.backends.gpu_graph import GpuGraphBackend

    log = work / "ort-capture.log"
    ort.set_default_logger_severity(1 if device == "cuda" else 3)
    try:
        with stderr_into(log):
            core = GpuGraphBackend(graph, [64, 128], device=device, warm=[(4, 128)], ort_log_level=1)
            for seed in range(3):
                core.infer(batch(4, 128, seed))
    finally:
        ort.set_default_logger_severity(3)
    lines = log.read_text(errors="replace").splitlines()
    graph_lines = [
        line
        for line in lines
        if "graph" in line.lower() and ("captur" in line.lower() or "replay" in line.lower())
    ]
    replays = sum("Replaying CUDA graph" in line for line in lines)
    core.log_level = 3  # the next sessions log as usual
    shared = check_shared(lines, core, device)
    if device != "cuda":
        return [
            row("capture", "SKIP", "the CPU provider has no CUDA graphs", log_lines=len(lines)),
            shared,
        ], core
    ok = replays >= 3
    return [
        row(
            "capture",
            "PASS" if ok else "FAIL",
            f"{replays} replays logged after capture at 4 x 128",
            lines=graph_lines[:6],
        ),
        shared,
    ], core


def check_shared(lines: list[str], core, device: str) -> dict:
    """Per session made (ONNX Runtime logs "Saving initialized tensors" ... "Done saving"), the
    shared weights it used as given, by bytes; none copied. (A weight the session folded into a
    constant at its shape, as DeBERTa's position table, is not used, so the bar is 90% of the bytes.)"""
    sizes = core.weights.sizes
    sessions, current = [], None
    for line in lines:
        if "Saving initialized tensors." in line:
            current = set()
        elif current is not None and "Using user supplied initializer with name (" in line:
            current.add(line.split("with name (", 1)[1].rsplit(")", 1)[0])
        elif current is not None and "Done saving initialized tensors" in line:
            sessions.append(current)
            current = None
    copied = [line for line in lines if "Cannot use user supplied initializer" in line]
    total = sum(sizes.values())
    shares = [sum(sizes.get(n, 0) for n in used) / total for used in sessions] if total else []
    figure = (
        f"{len(sizes)} weights ({total / 2**20:.1f} MiB) given to {len(sessions)} sessions: each used "
        f"{', '.join(f'{100 * x:.0f}%' for x in shares) or '-'} of their bytes as given; {len(copied)} copied"
    )
    if device != "cuda":  # the CPU provider folds the fp16 weights it has no kernel for into float32 copies
        return row(
            "shared weights",
            "SKIP" if shares and not copied else "FAIL",
            figure + " (the CPU provider folds fp16 weights into float32 copies)",
        )
    ok = len(sessions) == 2 and min(shares) >= 0.9 and not copied
    return row("shared weights", "PASS" if ok else "FAIL", figure, copied=copied[:3])


def check_fresh_inputs(core) -> dict:
    """50 new batches at the captured 4 x 128: the captured shape against the dynamic session."""
    worst, seen, repeated = 0.0, set(), 0
    for seed in range(100, 150):
        b = batch(4, 128, seed)
        _, probs = core.infer(b)
        feeds = {n: getattr(b, n) for n in core.input_names}
        _, dynamic = core.gpu.call(core.dynamic.run, feeds)
        columns = int(b.sentence_ids.max()) + 1
        worst = max(worst, float(np.abs(probs[:, :columns] - dynamic[:, :columns]).max()))
        key = probs.tobytes()
        repeated += key in seen
        seen.add(key)
    ok = worst <= MAX_DPROB and repeated == 0
    return row(
        "fresh inputs",
        "PASS" if ok else "FAIL",
        f"50 calls at 4 x 128: max |dp| {worst:.2e} against the dynamic session (<= {MAX_DPROB}); "
        f"{repeated} repeated outputs",
        dprob_vs_dynamic=worst,
        repeated=repeated,
    )


def check_threads(core) -> dict:
    """4 threads x 20 calls on 4 x 128 and 2 x 64, against the same calls made one by one."""
    core.gpu.call(core._capture, 2, 64)
    work = [(r, n, s) for s in range(10) for r, n in ((4, 128), (2, 64))]
    expected = {w: core.infer(batch(*w))[1] for w in work}
    results: dict = {}
    errors: list[str] = []

    def client(k: int) -> None:
        for w in (work * 2)[k::4]:
            try:
                got = core.infer(batch(*w))[1]
                results[w] = max(results.get(w, 0.0), float(np.abs(got - expected[w]).max()))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worst = max(results.values(), default=float("nan"))
    ok = not errors and len(results) == len(work) and worst <= 1e-3
    return row(
        "threads",
        "PASS" if ok else "FAIL",
        f"4 threads x 20 calls on two shapes: {len(errors)} errors, "
        f"max |dp| {worst:.2e} against the same calls one by one",
        errors=errors[:3],
    )


def check_providers(graph: Path, device: str, work: Path) -> dict:
    """One profiled run without CUDA graphs at 4 x 128: the provider of every node."""
    from engine.backends.gpu_graph import GpuGraphBackend

    core = GpuGraphBackend(
        graph, [128], device=device, cuda_graphs=False, warm=[(4, 128)], profile=str(work / "ort-profile")
    )
    try:
        core.infer(batch(4, 128, 7))
        shape = core.shapes[(4, 128)]
        profile = Path(core.gpu.call(shape.session.end_profiling))
    finally:
        core.close()
    events = json.loads(profile.read_text())
    nodes = {}
    for e in events:
        if e.get("cat") == "Node" and isinstance(e.get("args"), dict) and e["args"].get("provider"):
            nodes[e["name"].rsplit("_kernel_time", 1)[0]] = (e["args"]["provider"], e["args"].get("op_name"))
    want = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    other = sorted(f"{name} ({op}: {provider})" for name, (provider, op) in nodes.items() if provider != want)
    ok = bool(nodes) and not other
    return row(
        "providers",
        "PASS" if ok else "FAIL",
        f"{len(nodes)} nodes profiled at 4 x 128, {len(other)} not on {want}",
        off_provider=other[:10],
    )


def check_memory(folder: Path, device: str) -> dict:
    """Device memory: a hidden-1024 model (exported into `folder`) loaded, three more captured
    shapes, one unshared session."""
    if device != "cuda":
        return row(
            "memory",
            "SKIP",
            "device memory is measured on a GPU (the CPU provider upcasts fp16 weights per session)",
        )
    graph = export_fp16(folder, WIDE)
    import onnxruntime as ort
    from engine.backends.gpu_graph import GpuGraphBackend

    base = device_used()
    if base is None:
        return row("memory", "FAIL", "no way to read device memory (torch or nvidia-smi)")
    core = GpuGraphBackend(graph, [64, 128], device=device, warm=[(1, 64)])
    try:
        weights = core.weights.bytes
        loaded = device_used()
        after = []
        for shape in ((2, 64), (1, 128), (2, 128)):
            core.gpu.call(core._capture, *shape)
            after.append(device_used())
        per_shape = (after[-1] - loaded) / 3
        opts = ort.SessionOptions()
        opts.add_free_dimension_override_by_name("batch", 1)
        opts.add_free_dimension_override_by_name("sequence", 64)
        before_plain = device_used()
        plain = ort.InferenceSession(
            str(graph),
            opts,
            providers=[
                (
                    "CUDAExecutionProvider",
                    {"enable_cuda_graph": "1", "arena_extend_strategy": "kSameAsRequested"},
                )
            ],
        )
        b = batch(1, 64, 0)
        plain.run(None, {n: getattr(b, n) for n in core.input_names})
        unshared = device_used() - before_plain
        del plain
    finally:
        core.close()
    mib = 2**20
    ok = unshared - per_shape >= 0.7 * weights
    return row(
        "memory",
        "PASS" if ok else "FAIL",
        f"weights {weights / mib:.0f} MiB; loaded (weights, dynamic session, 1 x 64) +{(loaded - base) / mib:.0f}"
        f" MiB; each further captured shape +{per_shape / mib:.0f} MiB; a session without the shared weights "
        f"+{unshared / mib:.0f} MiB",
        weights_bytes=weights,
        loaded_bytes=loaded - base,
        per_shape_bytes=per_shape,
        unshared_bytes=unshared,
    )


#: seconds each step may take on a GPU machine (its CPU exports the models): a step starts only where they fit
ESTIMATES = {
    "export": 20.0,
    "capture": 15.0,
    "fresh inputs": 10.0,
    "threads": 10.0,
    "providers": 10.0,
    "memory": 40.0,
    "two models": 40.0,
}


def run_checks(
    device: str,
    work: Path,
    emit: Callable[[dict], None],
    log: Callable[[str], None] = print,
    allows: Callable[[float], bool] = lambda seconds: True,
) -> list[dict]:
    """Every check in order, each row emitted as it comes; a check that raises is a FAIL, one
    the budget (`allows(seconds)`) has no room for is not started (its row says so)."""
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.time()

    def done(r: dict) -> None:
        r["at_s"] = round(time.time() - t0, 1)
        rows.append(r)
        emit(r)
        log(f"GPU check {r['check']}: {r['result']}: {r['figure']}")

    def attempt(name: str, fn: Callable[[], Any]) -> Any:
        if not allows(ESTIMATES[name]):
            done(row(name, "SKIP", "not started: the budget was spent", skipped="the budget was spent"))
            return None
        try:
            return fn()
        except Exception as exc:
            done(row(name, "FAIL", f"{type(exc).__name__}: {str(exc)[:300]}"))
            return None

    tiny = attempt("export", lambda: export_fp16(work / "tiny", TINY))
    if tiny is None:
        return rows
    first = attempt("capture", lambda: check_capture(tiny, device, work))
    if first is not None:
        checks, core = first
        for r in checks:
            done(r)
        try:
            for name, fn in (("fresh inputs", check_fresh_inputs), ("threads", check_threads)):
                result = attempt(name, lambda fn=fn: fn(core))
                if result is not None:
                    done(result)
        finally:
            core.close()
    from benchmarks.gpu_run.serving import check_two_models

    for name, fn in (
        ("providers", lambda: check_providers(tiny, device, work)),
        ("memory", lambda: check_memory(work / "wide", device)),
        ("two models", lambda: check_two_models(work, device)),
    ):
        result = attempt(name, fn)
        if result is not None:
            done(result)
    return rows


def main(argv=None) -> int:
    """Run the checks; exit 1 if one failed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--work", help="where the test models are made (default: a temporary folder)")
    ap.add_argument("--out", help="the rows as JSON")
    a = ap.parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="prune-gpu-check-"))
    rows = run_checks(a.device, work, lambda r: None)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2, default=str))
    return 1 if any(r["result"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
