"""The GPU run's serving checks (#70), what a CPU cannot settle, each a check row as check.py's:

- two models: a pruner and an LLMLingua-2 compressor in one process, on the process's one GPU
  thread: the compressor captures every shape it serves while the pruner serves 100 calls from
  another thread; no call and no capture may fail (a capture that overlapped the other model's
  copies or synchronizes would: "operation not permitted when stream is capturing"), and both
  end with captured shapes;
- full size: the full model's fp16 export (Provence's size in the GPU run) loaded as the server
  loads it, then 1 x 128, 32 x 512 and 64 x 512 captured: the device memory after the weights,
  after the dynamic session and after each shape, each shape's build-and-capture seconds (the
  backend's own report, as /info and /metrics show it), whether the weights were shared in
  place; and the captured 32 x 512 against fp32 PyTorch on the same batch.

gpu.py runs both: the first in its GPU check (check.py), the second once the full export is done.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.gpu_run.check import MAX_DPROB, TINY, batch, export_fp16, row

#: the full-size shapes whose memory and capture seconds the GPU run reports
FULL_SHAPES = ((1, 128), (32, 512), (64, 512))
#: the full-size shape compared with fp32 PyTorch (captured)
FIDELITY_SHAPE = (32, 512)
MiB = 2**20


def lingua_fp16(folder: Path) -> Path:
    """A tiny LLMLingua-2 (BERT layout) checkpoint exported at fp16 into `folder`, reused when there."""
    graph = folder / "fp16" / "model.onnx"
    if graph.is_file():
        return graph
    from export.lingua_checkpoints import make_lingua_checkpoint
    from export.onnx import export_model

    ck = make_lingua_checkpoint("bert", folder / "llmlingua-2-bert-base-multilingual-cased-meetingbank")
    export_model(ck, folder / "fp16", precision="fp16", verify=False, overwrite=True, log=lambda m: None)
    return graph


def check_two_models(work: Path, device: str, calls: int = 100) -> dict:
    """A compressor capturing while a pruner serves `calls` calls, in one process."""
    from engine.backends.gpu_graph import GpuGraphBackend
    from engine.backends.gpu_token_probs import GpuTokenProbs

    pruner_graph, lingua_graph = export_fp16(work / "tiny", TINY), lingua_fp16(work / "lingua")
    pruner = GpuGraphBackend(pruner_graph, [64, 128], device=device, warm=[(4, 128)])
    compressor = None
    errors: list[str] = []
    served = [0]

    def serve() -> None:
        for i in range(calls):
            try:
                pruner.infer(batch(4 if i % 2 else 2, 128, i))
                served[0] += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    try:
        client = threading.Thread(target=serve)
        client.start()
        t0 = time.perf_counter()
        compressor = GpuTokenProbs(lingua_graph, device=device, warm="all", max_graphs=12)
        capture_s = time.perf_counter() - t0
        client.join()
        same = compressor.backend.gpu is pruner.gpu
        failed = {**pruner.failed, **compressor.backend.failed}
        captured = (len(pruner.shapes), len(compressor.backend.shapes))
    finally:
        pruner.close()
        if compressor is not None:
            compressor.close()
    ok = not errors and not failed and same and min(captured) > 0 and served[0] == calls
    return row(
        "two models",
        "PASS" if ok else "FAIL",
        f"the compressor captured {captured[1]} shapes in {capture_s:.1f} s while the pruner served "
        f"{served[0]} of {calls} calls ({captured[0]} shapes captured): {len(errors)} failed calls, "
        f"{len(failed)} failed captures; one GPU thread: {same}",
        errors=errors[:3],
        failed_captures={f"{r}x{n}": why[:200] for (r, n), why in failed.items()},
    )


def check_full_size(graph: Path, checkpoint: Path, device: str) -> dict:
    """The full model's device memory and capture seconds per shape, and a captured full-size shape
    against fp32 PyTorch."""
    from benchmarks.gpu_run.cases import model_batch, reference_probs
    from benchmarks.gpu_run.models import config, load_module
    from engine.backends.gpu_graph import GpuGraphBackend
    from engine.pipeline.encode import BatchingConfig

    budget = BatchingConfig(max_batch_tokens=64 * 512, max_batch_size=64)
    core = GpuGraphBackend(
        graph, [128, 512], device=device, batching=budget, warm=list(FULL_SHAPES), memory_limit=1.0
    )
    try:
        report = core.report()
        module = load_module(checkpoint, "eager")
        if isinstance(module, str):
            raise RuntimeError(f"the PyTorch reference does not load: {module}")
        check, ref = reference_probs(module, *FIDELITY_SHAPE, int(config(checkpoint)["vocab_size"]), device)
        captured = tuple(FIDELITY_SHAPE) in core.shapes
        _, probs = core.infer(model_batch(check))
        probs = np.asarray(probs)[:, : ref.shape[1]]
        mask = check["sentence_ids"]
        columns = [(r, s) for r in range(mask.shape[0]) for s in range(ref.shape[1]) if (mask[r] == s).any()]
        dprob = float(max(abs(probs[r, s] - ref[r, s]) for r, s in columns))
        agree = float(np.mean([(probs[r, s] > 0.5) == (ref[r, s] > 0.5) for r, s in columns]))
    finally:
        core.close()

    def mib(value) -> str:
        return "-" if value is None else f"{value / MiB:.0f} MiB"

    shapes = {(s["rows"], s["length"]): s for s in report["shapes"]}
    per_shape = "; ".join(
        f"{r} x {n}: {mib(shapes[(r, n)]['bytes'])} in {shapes[(r, n)]['capture_seconds']:.1f} s"
        if (r, n) in shapes
        else f"{r} x {n}: not captured"
        for r, n in FULL_SHAPES
    )
    ok = (
        len(shapes) == len(FULL_SHAPES)
        and not report["failed_shapes"]
        and captured
        and dprob <= MAX_DPROB
        and agree >= 0.99
        and report["weights_shared"] is not False
    )
    return row(
        "full size",
        "PASS" if ok else "FAIL",
        f"weights {mib(report['weights_bytes'])} (shared in place: {report['weights_shared']}), dynamic session "
        f"{mib(report['dynamic_session_bytes'])}; {per_shape}; held {mib(report['total_bytes'])}; captured "
        f"{FIDELITY_SHAPE[0]} x {FIDELITY_SHAPE[1]} against fp32 PyTorch: max |dp| {dprob:.2e} (<= {MAX_DPROB}), "
        f"decisions at 0.5 {100 * agree:.2f}% equal",
        report=report,
        full_size_dprob=dprob,  # not max_abs_dprob: the fidelity table's rows name their model
        full_size_decisions_equal=agree,
    )
