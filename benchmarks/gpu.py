"""GPU throughput of a Provence-size model (DeBERTa-v3-large configuration, random
weights: speed does not depend on them) through the engine's PyTorch module.

    python -m benchmarks.gpu --out results.json            # on a GPU machine (benchmarks/gpu.sh)
    python -m benchmarks.gpu --tiny --device cpu --out x.json   # a dry run of the script on CPU

For lengths 128/512 and batch sizes 1/8/64/256 it times fp32, fp16 and bf16 eager
forwards (and SDPA attention) of the full contract module (encoder, heads, float32
softmax and sentence pooling), with CUDA events after warm-up, and reports sequences/s
and the share of the GPU's dense fp16 peak, counting the model's FLOPs:

    per sequence of L tokens, per layer: 2 x 12 h^2 L (projections and FFN, 4h intermediate)
    + 2 x 2 x L^2 h (QK^T and AV) + 2 x 2 x L^2 h (DeBERTa's c2p and p2c terms)
    + 2 x 2 x L x 2k x h (position key/query projections over 2k relative positions, k = 256)

The engine's own path runs first: the same configuration exported by `prune export`
(fp16, the headline figure, then fp32) and run by the engine's ONNX Runtime backend (CUDA
provider with IO binding; the TensorRT provider where the onnxruntime-gpu build has it),
with p50/p99 at batch 1 and each graph's largest probability difference from the fp32
PyTorch reference.

One budget bounds the run (`--budget-s`, exports and sessions included): the engine's
paths may start cases until `--engine-share` of it has passed, PyTorch's until all of it
has; a case that would start later is listed as not measured. The report is rewritten
after every case, and on SIGTERM (gpu.sh runs this under `timeout`), so what was measured
comes back whatever stops the run.

The PyTorch part needs torch and transformers; the ONNX Runtime part also onnxruntime-gpu
and onnx (benchmarks/gpu.sh installs them from a folder of wheels).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import sys
import time

from engine.tools.harness import machine_info, stderr

LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
         "vocab_size": 128100, "max_position_embeddings": 512, "relative_attention": True,
         "pos_att_type": ["p2c", "c2p"], "position_buckets": 256, "norm_rel_ebd": "layer_norm",
         "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0,
         "max_relative_positions": -1, "pooler_hidden_size": 1024, "pooler_hidden_act": "gelu",
         "hidden_act": "gelu", "layer_norm_eps": 1e-7, "num_labels": 1}
TINY = {**LARGE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
        "vocab_size": 1000, "pooler_hidden_size": 64}


def flops_per_sequence(cfg: dict, length: int) -> float:
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    k = cfg.get("position_buckets", 256)
    per_layer = (2 * 12 * h * h * length + 2 * 2 * length * length * h + 2 * 2 * length * length * h
                 + 2 * 2 * length * 2 * k * h)
    return n * per_layer + 2 * h * 2 * length  # + token head


LARGE_SIZES = {k: LARGE[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}
TINY_SIZES = {k: TINY[k] for k in LARGE_SIZES}


class _Feeds:
    """The `ModelBatch` face the backends use: `.inputs(names)` and `.shape`."""

    def __init__(self, arrays):
        self.arrays, self.shape = arrays, arrays["input_ids"].shape

    def inputs(self, names):
        return {n: self.arrays[n] for n in names}


def _feeds(batch: int, length: int, vocab: int, seed: int = 0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(5, vocab, size=(batch, length), dtype=np.int64),
            "attention_mask": np.ones((batch, length), dtype=np.int64),
            "sentence_ids": np.tile(np.arange(length, dtype=np.int64) // 32, (batch, 1))}


def onnxruntime_rows(args, cfg_dict: dict, until: float, log, rows: list[dict], save) -> None:
    """The engine's own path: a random-weight Provence-size checkpoint exported by
    `prune export` (fp32 and fp16), run by the engine's ONNX Runtime backend on
    `args.device` (CUDA with IO binding; the TensorRT provider too where present):
    sequences/s per length and batch, p50/p99 at batch 1, and the largest probability
    difference from the fp32 PyTorch reference on one batch."""
    import statistics
    import tempfile
    from pathlib import Path

    import numpy as np
    import onnxruntime as ort
    import torch

    from engine.backends.onnxruntime import OnnxRuntimeBackend, tensorrt_options
    from engine.pytorch.loading import load_torch_model
    from export.checkpoints import make_test_checkpoint
    from export.onnx import export_model

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="prune-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    ck = make_test_checkpoint("provence", work / "checkpoint", sizes=TINY_SIZES if args.tiny else LARGE_SIZES)
    tm = load_torch_model(ck)
    model = tm.module
    vocab = int(model.config.vocab_size)
    check = _feeds(8, min(128, max(args.lengths)), vocab, seed=1)
    with torch.inference_mode():
        _, ref_probs = model(*(torch.from_numpy(check[n]) for n in ("input_ids", "attention_mask", "sentence_ids")))
    ref_probs = ref_probs.float().numpy()
    del model, tm
    cuda = args.device == "cuda"
    # both exports first (prune bench, after this script, runs on them), then the sweeps, fp16
    # first (the headline figure), each starting cases until the engine's share has passed
    for precision in ("fp16", "fp32"):
        t = time.time()
        export_model(ck, work / precision, precision=precision, verify=False, overwrite=True,  # a rerun reuses --keep
                     log=lambda m: None)
        log(f"exported the {precision} graph in {time.time() - t:.0f} s")
        rows.append({"path": f"export {precision}", "seconds": time.time() - t})
        save()
    for precision in ("fp16", "fp32"):
        out = work / precision
        if time.time() > until:
            rows.append({"path": f"onnxruntime {precision}", "skipped": "the engine's share of the budget was spent"})
            save()
            continue
        variants = [("onnxruntime-cuda" if cuda else "onnxruntime-cpu", None)]
        if cuda and "TensorrtExecutionProvider" in ort.get_available_providers():
            variants.append(("onnxruntime-tensorrt", tensorrt_options(
                ["input_ids", "attention_mask", "sentence_ids"], sorted(set(args.lengths)), max(args.batches),
                work / "trt-cache")))
        for name, trt in variants:
            try:
                backend = OnnxRuntimeBackend(out / "model.onnx", device="cuda" if cuda else "cpu",
                                             io_binding=True, tensorrt=trt, log=log)
            except Exception as exc:
                rows.append({"path": f"{name} {precision}", "error": str(exc)[:300]})
                save()
                continue
            path = f"{name} {precision}"
            if backend.tensorrt_fallback:     # CUDA under TensorRT's name: measured once, as CUDA
                rows.append({"path": path, "skipped": "TensorRT's libraries did not load: ONNX Runtime ran CUDA"})
                log(f"{path}: skipped (TensorRT's libraries did not load; ONNX Runtime fell back to CUDA)")
                continue
            _, probs = backend.infer(_Feeds(check))
            dp = float(np.abs(probs - ref_probs).max())
            rows.append({"path": path, "check": "vs fp32 PyTorch, batch 8", "max_abs_dprob": dp,
                         "providers": backend.session.get_providers()})
            save()
            log(f"{path}: max |dp| vs fp32 PyTorch {dp:.2e} ({backend.session.get_providers()[0]})")
            for length in args.lengths:
                one = _Feeds(_feeds(1, length, vocab))
                for _ in range(3):
                    backend.infer(one)
                lat = []
                for _ in range(max(10, args.iters * 3)):
                    t = time.perf_counter()
                    backend.infer(one)
                    lat.append(time.perf_counter() - t)
                lat.sort()
                rows.append({"path": path, "length": length, "batch": 1, "p50_ms": statistics.median(lat) * 1000,
                             "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000})
                for bs in args.batches:
                    if time.time() > until:
                        rows.append({"path": path, "length": length, "batch": bs,
                                     "skipped": "the engine's share of the budget was spent"})
                        continue
                    feeds = _Feeds(_feeds(bs, length, vocab))
                    try:
                        for _ in range(2):
                            backend.infer(feeds)
                        t = time.perf_counter()
                        for _ in range(args.iters):
                            backend.infer(feeds)
                        sec = (time.perf_counter() - t) / args.iters
                    except Exception as exc:
                        rows.append({"path": path, "length": length, "batch": bs, "error": str(exc)[:200]})
                        break
                    seq_s = bs / sec
                    tflops = flops_per_sequence(cfg_dict, length) * seq_s / 1e12
                    row = {"path": path, "length": length, "batch": bs, "ms_per_batch": sec * 1000,
                           "sequences_per_s": seq_s, "tokens_per_s": seq_s * length, "tflops": tflops,
                           "share_of_fp16_peak": tflops / args.peak_tflops}
                    rows.append(row)
                    save()
                    print(json.dumps(row), flush=True)
            del backend


def _path(row: dict) -> str:
    """A row's path name: the ONNX Runtime rows carry one, the PyTorch rows attn and dtype."""
    return row.get("path") or f"torch {row['attn']} {row['dtype']}"


def markdown(report: dict) -> str:
    """The best sequences/s per path and length, p50/p99 at batch 1, and the fidelity check."""
    lines = [f"# GPU benchmark ({report['info'].get('gpu', report['info']['device'])}, "
             f"{report['info']['config']})", "", f"Command: `{report['command']}`", "",
             "| path | length | best sequences/s (batch) | share of fp16 peak | p50 / p99 ms at batch 1 |",
             "|---|---|---|---|---|"]
    rows = [r for r in report["rows"] if "sequences_per_s" in r or "p50_ms" in r]
    keys = sorted({(_path(r), r["length"]) for r in rows})
    for path, length in keys:
        mine = [r for r in rows if _path(r) == path
                and r["length"] == length]
        best = max((r for r in mine if "sequences_per_s" in r), key=lambda r: r["sequences_per_s"], default=None)
        lat = next((r for r in mine if "p50_ms" in r), None)
        lines.append(f"| {path} | {length} | "
                     + (f"{best['sequences_per_s']:.1f} ({best['batch']}) | {best['share_of_fp16_peak']:.1%}"
                        if best else "- | -")
                     + (f" | {lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} |" if lat else " | - |"))
    checks = [r for r in report["rows"] if "max_abs_dprob" in r]
    if checks:
        lines += ["", "| path | max abs probability difference vs fp32 PyTorch | providers |", "|---|---|---|"]
        lines += [f"| {r['path']} | {r['max_abs_dprob']:.2e} | {', '.join(r['providers'])} |" for r in checks]
    lines += [f"\nNot measured: {r['path']}: {r['skipped']}." for r in report["rows"] if "skipped" in r]
    return "\n".join(lines) + "\n"


def plot(report: dict, path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in report["rows"] if "sequences_per_s" in r]
    length = max((r["length"] for r in rows), default=None)
    if length is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in sorted({_path(r) for r in rows}):
        pts = sorted((r["batch"], r["sequences_per_s"]) for r in rows
                     if _path(r) == name and r["length"] == length)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel(f"sequences/s at length {length}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny configuration (dry run on CPU)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    ap.add_argument("--attn", nargs="+", default=["eager", "sdpa"])
    ap.add_argument("--peak-tflops", type=float, default=990.0, help="dense fp16 peak (H200: ~990)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="seconds for the whole run, exports included: no case starts after it")
    ap.add_argument("--engine-share", type=float, default=0.7,
                    help="the share of the budget after which the engine's paths (first) start no case")
    ap.add_argument("--out", required=True, help="the JSON report")
    ap.add_argument("--markdown", help="also write a markdown summary here")
    ap.add_argument("--plot", help="also write a PNG here (needs matplotlib)")
    ap.add_argument("--no-onnxruntime", action="store_true", help="PyTorch paths only")
    ap.add_argument("--keep", help="keep the checkpoint and the fp32/fp16 exports in this folder "
                    "(checkpoint/, fp32/, fp16/: gpu.sh runs prune bench on them)")
    args = ap.parse_args(argv)
    log = stderr

    cfg_dict = TINY if args.tiny else LARGE
    dev = torch.device(args.device)
    rows: list[dict] = []
    start = time.time()
    info = {"torch": torch.__version__, "device": args.device, "python": platform.python_version(),
            "config": "tiny" if args.tiny else "deberta-v3-large (Provence)", "budget_s": args.budget_s,
            "machine": machine_info(args.device)}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    report = {"info": info, "rows": rows, "command": shlex.join(sys.argv)}

    def save() -> None:
        info["elapsed_s"] = time.time() - start
        tmp = args.out + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(report, fh, indent=2)
        os.replace(tmp, args.out)

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    try:
        if not args.no_onnxruntime:
            try:
                onnxruntime_rows(args, cfg_dict, start + args.engine_share * args.budget_s, log, rows, save)
            except Exception as exc:   # the PyTorch figures are still measured
                rows.append({"path": "onnxruntime", "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                log(f"onnxruntime paths failed: {exc}")
        torch_rows(args, cfg_dict, dev, start + args.budget_s, rows, save)
    finally:
        save()
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(markdown(report))
        if args.plot and not plot(report, args.plot):
            log("no plot: matplotlib is not installed")
    return 0


def torch_rows(args, cfg_dict: dict, dev, until: float, rows: list[dict], save) -> None:
    """PyTorch eager and SDPA forwards in each dtype, until `until`."""
    import torch
    from transformers import AutoConfig

    from engine.pytorch.modeling import ProvenceModel
    for attn in args.attn:
        cfg = AutoConfig.for_model("deberta-v2", **cfg_dict)
        cfg._attn_implementation = attn
        try:
            base = ProvenceModel(cfg).eval()
        except Exception as exc:  # an attention implementation DeBERTa lacks
            rows.append({"attn": attn, "error": str(exc)[:200]})
            continue
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            model = base.to(dev, dtype)
            for length in args.lengths:
                for bs in args.batches:
                    if time.time() > until:
                        rows.append({"attn": attn, "dtype": dtype_name, "length": length, "batch": bs,
                                     "skipped": "the budget was spent"})
                        continue
                    ids = torch.randint(5, cfg.vocab_size, (bs, length), device=dev)
                    mask = torch.ones_like(ids)
                    sid = torch.arange(length, device=dev).div(32, rounding_mode="floor").expand(bs, length).contiguous()
                    try:
                        with torch.inference_mode():
                            for _ in range(2):
                                model(ids, mask, sid)
                            if dev.type == "cuda":
                                torch.cuda.synchronize()
                                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                t0.record()
                                for _ in range(args.iters):
                                    r, p = model(ids, mask, sid)
                                t1.record()
                                torch.cuda.synchronize()
                                sec = t0.elapsed_time(t1) / 1000 / args.iters
                            else:
                                t = time.perf_counter()
                                for _ in range(args.iters):
                                    r, p = model(ids, mask, sid)
                                sec = (time.perf_counter() - t) / args.iters
                        finite = bool(torch.isfinite(p).all() and torch.isfinite(r).all())
                    except torch.cuda.OutOfMemoryError if dev.type == "cuda" else MemoryError:
                        rows.append({"attn": attn, "dtype": dtype_name, "length": length, "batch": bs, "error": "OOM"})
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                        continue
                    seq_s = bs / sec
                    tflops = flops_per_sequence(cfg_dict, length) * seq_s / 1e12
                    row = {"attn": attn, "dtype": dtype_name, "length": length, "batch": bs,
                           "ms_per_batch": sec * 1000, "sequences_per_s": seq_s, "tflops": tflops,
                           "share_of_fp16_peak": tflops / args.peak_tflops, "finite": finite}
                    rows.append(row)
                    save()
                    print(json.dumps(row), flush=True)
            del model
            if dev.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
