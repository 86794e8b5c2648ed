"""The GPU run's timed cases, each a generator of report rows (one per shape), so that the
run saves its report after every row and can put a path's remaining shapes off (the
engine's rows first, as soon as their export is ready):

- `engine_rows`: the engine's backend on an export, as `Pruner.load` opens it (on a GPU, the
  fp16 GPU graph in fixed-shape sessions captured as CUDA graphs, IO binding), after a
  fidelity check against the fp32 PyTorch reference;
- `torch_rows`: the same checkpoint's PyTorch module, eager or under torch.compile (its
  compile time, the first call at each shape, counted apart from the timed runs).

Every shape: a few untimed runs (the first, which makes the engine's session for the shape
or compiles, timed apart: `first_s`), then `iters` timed runs, each its own wall time (the
GPU synchronised), the median as ms per batch."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

INPUTS = ("input_ids", "attention_mask", "sentence_ids")
Row = dict


def flops_per_sequence(cfg: dict, length: int) -> float:
    """The model's dense work for one sequence of `length` tokens (benchmarks/gpu.py's doc)."""
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    k = cfg.get("position_buckets", 256)
    per_layer = (
        2 * 12 * h * h * length
        + 2 * 2 * length * length * h
        + 2 * 2 * length * length * h
        + 2 * 2 * length * 2 * k * h
    )
    return n * per_layer + 2 * h * 2 * length  # + token head


def feeds(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids, a full mask and sentences of 32 tokens: one batch's arrays."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(5, vocab, size=(batch, length), dtype=np.int64),
        "attention_mask": np.ones((batch, length), dtype=np.int64),
        "sentence_ids": np.tile(np.arange(length, dtype=np.int64) // 32, (batch, 1)),
    }


def model_batch(arrays: dict[str, np.ndarray]):
    """The arrays as the engine's ModelBatch (what a backend runs)."""
    from engine.pipeline.encode import ModelBatch

    rows = arrays["input_ids"].shape[0]
    return ModelBatch(
        arrays["input_ids"],
        arrays["attention_mask"],
        arrays["sentence_ids"],
        np.zeros_like(arrays["input_ids"]),
        list(range(rows)),
    )


@dataclass
class Context:
    """What every case needs: the model's configuration and vocabulary, the device, the
    timing settings, the budget's say (`allows(estimate)`), whether an export is running
    beside it, and the log."""

    cfg: dict
    vocab: int
    device: str
    iters: int
    peak_tflops: float
    allows: Callable[[float], bool]
    beside_export: Callable[[], bool]
    log: Callable[[str], None]
    spent: str = "not started: the budget was spent"


def _times(
    run: Callable[[], Any], iters: int, sync: Callable[[], None], warmup: int = 3
) -> tuple[float, list[float]]:
    """(the first run's seconds, each timed run's seconds) after `warmup` untimed runs."""
    t0 = time.perf_counter()
    run()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        run()
    sync()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        sync()
        out.append(time.perf_counter() - t0)
    return first, out


def timed_row(base: Row, ctx: Context, batch: int, length: int, times: tuple[float, list[float]]) -> Row:
    """A measured case's row: the first run's seconds, median and p99 wall time, sequences
    and tokens per second, TFLOP/s and the share of the fp16 peak."""
    first, seconds = times
    med = statistics.median(seconds)
    ordered = sorted(seconds)
    seq_s = batch / med
    tflops = flops_per_sequence(ctx.cfg, length) * seq_s / 1e12
    return {
        **base,
        "batch": batch,
        "length": length,
        "first_s": first,
        "ms_per_batch": med * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
        "iters": len(seconds),
        "sequences_per_s": seq_s,
        "tokens_per_s": seq_s * length,
        "tflops": tflops,
        "share_of_fp16_peak": tflops / ctx.peak_tflops,
        "beside_export": ctx.beside_export(),
    }


def reference_probs(
    module, rows: int, length: int, vocab: int, device: str = "cpu"
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A check batch (`rows` x `length`) and the fp32 PyTorch module's probabilities on it,
    computed on `device` (then the module goes back to the CPU)."""
    import torch

    check = feeds(rows, length, vocab, seed=1)
    module.to(device=device, dtype=torch.float32)
    try:
        with torch.inference_mode():
            _, probs = module(*(torch.from_numpy(check[n]).to(device) for n in INPUTS))
        return check, probs.float().cpu().numpy()
    finally:
        module.to("cpu")


def engine_rows(
    make: Callable[[], Any],
    path: str,
    shapes: list[tuple[int, int]],
    ctx: Context,
    reference,
    base: Row | None = None,
) -> Iterator[Row]:
    """The engine's backend, `make()` (a Pruner's, as `Pruner.load` opens the export): a
    fidelity row, then a row per shape."""
    base = {**(base or {}), "path": path}
    if not ctx.allows(0.0):
        yield {**base, "skipped": ctx.spent}
        return
    try:
        backend = make()
    except Exception as exc:
        yield {**base, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return
    if getattr(backend, "tensorrt_fallback", False):  # CUDA under TensorRT's name: measured once, as CUDA
        yield {**base, "skipped": "TensorRT's libraries did not load: ONNX Runtime ran CUDA"}
        return
    session = getattr(backend, "session", None)
    providers = list(session.get_providers()) if session is not None else [getattr(backend, "provider", "-")]
    try:
        check, ref = reference
        captured = getattr(backend, "capture", None)
        if captured is not None:  # the GPU graph: the check runs in the captured shape, as served
            captured(*check["input_ids"].shape)
        _, probs = backend.infer(model_batch(check))
        probs = np.asarray(probs)[:, : ref.shape[1]]  # a GPU graph returns a column per position
        yield {
            **base,
            "check": f"fp32 PyTorch, batch {check['input_ids'].shape[0]} x {check['input_ids'].shape[1]}",
            "max_abs_dprob": float(np.abs(probs - ref).max()),
            "providers": providers,
            "backend": backend.describe(),
        }
    except Exception as exc:
        yield {**base, "error": f"fidelity check: {type(exc).__name__}: {str(exc)[:300]}"}
    for batch, length in shapes:
        if not ctx.allows(0.0):
            yield {**base, "batch": batch, "length": length, "skipped": ctx.spent}
            continue
        one = model_batch(feeds(batch, length, ctx.vocab))
        try:
            t0 = time.perf_counter()
            captured = getattr(backend, "capture", None)
            if captured is not None:  # the GPU graph: its session for the shape made (and captured) first
                captured(batch, length)
            capture_s = time.perf_counter() - t0
            times = _times(lambda: backend.infer(one), ctx.iters, lambda: None)
        except Exception as exc:
            yield {
                **base,
                "batch": batch,
                "length": length,
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
            }
            continue
        yield {**timed_row(base, ctx, batch, length, times), **({"capture_s": capture_s} if captured else {})}
    yield {**base, "kind": "backend", "backend": backend.describe()}
    backend.close()


def torch_rows(
    module,
    path: str,
    shapes: list[tuple[int, int]],
    ctx: Context,
    compile_backend: str | None = None,
    estimate: Callable[[], float] = lambda: 0.0,
    base: Row | None = None,
) -> Iterator[Row]:
    """`module` (on the device, at its dtype) eager, or under torch.compile with
    `compile_backend` (static shapes: a compile per shape, its time in `compile_s`): a row
    per shape. A shape starts only where the budget allows `estimate()` more seconds
    (the compile's); after a compile error, the remaining shapes are not tried."""
    import torch

    base = {**(base or {}), "path": path}
    cuda = ctx.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = module
    broken = None
    for batch, length in shapes:
        at = {**base, "batch": batch, "length": length}
        if broken:
            yield {**at, "skipped": f"torch.compile failed at an earlier shape ({broken})"}
            continue
        if not ctx.allows(estimate() if compile_backend else 0.0):
            yield {
                **at,
                "skipped": ctx.spent
                + (
                    f" (its compile takes about {estimate():.0f} s)" if compile_backend and estimate() else ""
                ),
            }
            continue
        arrays = feeds(batch, length, ctx.vocab)
        x = [torch.from_numpy(arrays[n]).to(ctx.device) for n in INPUTS]
        try:
            with torch.inference_mode():
                if compile_backend and model is module:
                    model = torch.compile(module, backend=compile_backend, dynamic=False)
                times = _times(lambda: model(*x), ctx.iters, sync)  # the first call at a shape compiles
        except Exception as exc:
            if cuda and isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
                yield {**at, "error": "out of GPU memory"}
                continue
            text = f"{type(exc).__name__}: {str(exc)[:300]}"
            broken = text[:80] if compile_backend else None
            yield {**at, "error": text}
            continue
        row = timed_row(base, ctx, batch, length, times)
        if compile_backend:
            row["compile_s"] = row["first_s"]
        yield row
