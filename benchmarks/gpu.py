"""Every GPU path of the engine side by side, in one budgeted run (benchmarks/gpu.sh):
a Provence-size model (DeBERTa-v3-large configuration, random weights: speed does not
depend on them), through the engine's ONNX Runtime backend and, as its peers, the same
checkpoint's PyTorch module eager and under torch.compile.

    python -m benchmarks.gpu --out gpu.json --markdown gpu.md --rag-data squad-dev-rag.jsonl
    python -m benchmarks.gpu --tiny --device cpu --out x.json     # a dry run on the CPU

In order, each part starting only while the budget allows it:

1. the checkpoints (24 layers, and a 6-layer cut of the same configuration), and the 24-layer
   model's fp16 export by `prune export`, started at once in the background on the CPU;
2. the GPU check (gpu_run/check.py, under 3 minutes): the design on this GPU, each check
   PASS or FAIL with its figure (capture and replay in ONNX Runtime's log, the weights
   shared, fresh inputs at a captured shape, 4 threads, every node on the CUDA provider,
   device memory of 4 shapes of a hidden-1024 model);
3. the cut at 1 x 512 and 16 x 512: torch eager fp16 while its fp16 export runs, the engine
   as soon as the export is done (as `Pruner.load` opens it on the GPU: one copy of the
   weights, each timed shape captured as a CUDA graph before it is timed, IO binding);
4. the 24-layer model (lengths 128/512 and batches 1/16/64 by default: fewer than the first
   run's 1/8/64/256, to fit the budget): torch eager fp16 at those shapes while its export
   runs, the engine's fp16 rows as soon as it is done; only then torch.compile fp16, the
   cut's first, then the full model's at 16 x 512 (when its compile, estimated from the
   cut's, fits before prune bench's share);
5. with --rag-data, `prune bench --device cuda` on that workload with the same checkpoint
   and export: the engine's fp16 path, torch batched fp16 and torch.compile batched fp16 on
   the same calls (it gets `--bench-reserve-s` at least).

fp32 (its export and rows) only with --fp32; TensorRT's provider only with --tensorrt.
Exports are counted in the budget and reused where `--keep` already holds an export of the
same checkpoint at the same precision (said in the log and the report). Each shape: 3
untimed runs, then `--iters` timed runs (wall time, the GPU synchronised; the median is
reported), sequences/s, tokens/s and the share of the GPU's dense fp16 peak from the FLOP
count (`gpu_run.cases.flops_per_sequence`: per layer 2 x 12 h^2 L for the projections and
FFN, 2 x 2 x L^2 h each for QK^T, AV and DeBERTa's c2p + p2c terms, 2 x 2 x L x 2k x h for
the position projections); torch.compile's compile time (the first call at a shape) is
kept apart. The engine's graphs are checked against the fp32 PyTorch module (largest
probability difference at a timed shape, `check_shape`, the reference computed on the device
in fp32). gpu.json and gpu.md are rewritten after every
row and on SIGTERM (gpu.sh runs this under `timeout`): skipped cases, errors, export times
and the parts not reached are listed in them; gpu.png at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import signal
import sys
import time
from pathlib import Path

from benchmarks.gpu_run.bench import read_bench, run_bench, stop_bench
from benchmarks.gpu_run.cases import Context, engine_rows, flops_per_sequence, reference_probs, torch_rows  # noqa: F401
from benchmarks.gpu_run.cases import feeds as _feeds  # noqa: F401 (../shared/gpu/compare_6layer.py imports it)
from benchmarks.gpu_run.models import Export, checkpoint, config, load_module
from benchmarks.gpu_run.report import markdown, plot, versions, write
from engine.machine.timing import stderr
from engine.machine.describe import machine_info

LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "vocab_size": 128100,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "position_biased_input": False,
    "type_vocab_size": 0,
    "max_relative_positions": -1,
    "pooler_hidden_size": 1024,
    "pooler_hidden_act": "gelu",
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-7,
    "num_labels": 1,
}
TINY = {
    **LARGE,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 1000,
    "pooler_hidden_size": 64,
}
LARGE_SIZES = {
    k: LARGE[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
}
TINY_SIZES = {k: TINY[k] for k in LARGE_SIZES}
SHORT = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}


class Budget:
    """The run's seconds: `left()`, and whether a part may start (`allows(estimate)`:
    more than `estimate` seconds left before the share kept for prune bench)."""

    def __init__(self, seconds: float, reserve: float = 0.0):
        self.seconds, self.reserve = seconds, reserve
        self.began = time.time()
        self.end = self.began + seconds

    def left(self) -> float:
        """Seconds left of the whole budget."""
        return self.end - time.time()

    def allows(self, estimate: float = 0.0) -> bool:
        """Whether a part needing `estimate` seconds fits before prune bench's share."""
        return self.left() - self.reserve > estimate


def shape(text: str) -> tuple[int, int]:
    """`16x512` -> (16, 512): batch x length."""
    try:
        batch, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BATCHxLENGTH (16x512), got {text!r}") from None
    return batch, length


def parse(argv=None) -> argparse.Namespace:
    """The run's flags."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny configuration (dry run on CPU)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512], help="the full model's lengths")
    ap.add_argument(
        "--batches", type=int, nargs="+", default=[1, 16, 64], help="the full model's batch sizes"
    )
    ap.add_argument("--cut-layers", type=int, default=6, help="layers of the cut (0: none)")
    ap.add_argument("--cut-shapes", type=shape, nargs="+", default=[(1, 512), (16, 512)])
    ap.add_argument(
        "--compile-shapes",
        type=shape,
        nargs="+",
        default=[(16, 512)],
        help="the full model's torch.compile shapes (a compile each)",
    )
    ap.add_argument("--peers", nargs="+", choices=["eager", "compile"], default=["eager", "compile"])
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["float16"],
        help="the PyTorch peers' dtypes (float32 joins with --fp32)",
    )
    ap.add_argument(
        "--attn", nargs="+", default=["eager"], help="the PyTorch module's attention implementations"
    )
    ap.add_argument(
        "--compile-backend", default="inductor", help="torch.compile's backend (aot_eager: a dry run)"
    )
    ap.add_argument(
        "--fp32", action="store_true", help="also export fp32 and measure it (the engine, PyTorch)"
    )
    ap.add_argument(
        "--tensorrt", action="store_true", help="also ONNX Runtime's TensorRT provider, where it loads"
    )
    ap.add_argument(
        "--fixed-shapes",
        action="store_true",
        help="on the CPU, open the GPU graph as the GPU does, in "
        "fixed-shape sessions (without CUDA graphs): the dry run's rehearsal of the engine's GPU path",
    )
    ap.add_argument("--peak-tflops", type=float, default=990.0, help="dense fp16 peak (H200: ~990)")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per shape (the median is reported)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=400.0,
        help="seconds for the whole run, exports and "
        "prune bench included: no part starts when it would not end in time",
    )
    ap.add_argument(
        "--bench-reserve-s",
        type=float,
        default=150.0,
        help="with --rag-data: seconds kept for prune bench at the end",
    )
    ap.add_argument("--bench-min-s", type=float, default=45.0, help="prune bench is not started with less")
    ap.add_argument("--rag-data", help="a RAG JSONL (squad-dev-rag.jsonl): then prune bench on it")
    ap.add_argument("--rag-queries", type=int, default=10)
    ap.add_argument("--rag-repeats", type=int, default=2)
    ap.add_argument(
        "--bench-paths",
        help="prune bench's --paths (default: the engine's fp16 path, torch batched "
        "fp16 and torch.compile batched fp16; their fp32 paths with --fp32)",
    )
    ap.add_argument("--out", required=True, help="the JSON report (bench.json and bench.md go beside it)")
    ap.add_argument("--markdown", help="also write a markdown summary here")
    ap.add_argument("--plot", help="also write a PNG here (needs matplotlib)")
    ap.add_argument("--no-onnxruntime", action="store_true", help="PyTorch paths only")
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="skip the first step, the GPU check "
        "(benchmarks/gpu_run/check.py: capture, shared weights, fresh inputs, threads, providers, memory)",
    )
    ap.add_argument(
        "--keep", help="keep the checkpoints and exports in this folder, and reuse them from there"
    )
    ap.add_argument("--logs", help="the exports' and prune bench's logs (default: KEEP/logs)")
    return ap.parse_args(argv)


class Run:
    """One run: its flags, budget, report (saved after every row) and exports."""

    def __init__(self, args: argparse.Namespace, argv: list[str] | None = None):
        import tempfile

        import torch

        self.args, self.log = args, stderr
        reserve = args.bench_reserve_s if args.rag_data else 0.0
        self.budget = Budget(args.budget_s, reserve)
        self.work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="prune-gpu-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs = Path(args.logs) if args.logs else self.work / "logs"
        self.rows: list[dict] = []
        self.exports: list[Export] = []
        self.compiles: dict[int, float] = {}  # layers -> the first torch.compile's seconds
        self.todo: list[str] = []
        self.full = ""  # the full model's label
        self.bench_proc = None
        self.bench_began = 0.0
        self.info = {
            "device": args.device,
            "config": "tiny" if args.tiny else "deberta-v3-large (Provence)",
            "budget_s": args.budget_s,
            "bench_reserve_s": reserve,
            "compile_backend": args.compile_backend,
            "peak_tflops": args.peak_tflops,
            "versions": versions(),
            "machine": machine_info(args.device),
        }
        if args.device == "cuda" and torch.cuda.is_available():
            self.info["gpu"] = torch.cuda.get_device_name(0)
        self.report = {
            "info": self.info,
            "rows": self.rows,
            "command": shlex.join(
                ["python", "-m", "benchmarks.gpu", *(sys.argv[1:] if argv is None else argv)]
            ),
        }

    def save(self) -> None:
        """gpu.json and gpu.md, each written whole (a reader never sees half a file)."""
        self.info["elapsed_s"] = time.time() - self.budget.began
        write(Path(self.args.out), json.dumps(self.report, indent=2, default=str))
        if self.args.markdown:
            write(Path(self.args.markdown), markdown(self.report))

    def emit(self, row: dict) -> None:
        """A row into the report (with `at_s`, the run's seconds when it came), saved at once."""
        row.setdefault("at_s", round(time.time() - self.budget.began, 1))
        self.rows.append(row)
        self.save()
        print(json.dumps(row, default=str), flush=True)

    def floor(self) -> float:
        """What the engine's rows leave of the budget: prune bench's least (its reserve is
        for what comes after the engine's rows, the peers' compiles)."""
        return min(self.budget.reserve, self.args.bench_min_s) if self.args.rag_data else 0.0

    def context(self, cfg: dict, engine: bool = False) -> Context:
        """The cases' context for a model of configuration `cfg` (the engine's rows may use
        prune bench's reserve down to its least)."""

        def allows(estimate: float) -> bool:
            return self.budget.left() - self.floor() > estimate if engine else self.budget.allows(estimate)

        return Context(
            cfg=cfg,
            vocab=int(cfg["vocab_size"]),
            device=self.args.device,
            iters=self.args.iters,
            peak_tflops=self.args.peak_tflops,
            allows=allows,
            beside_export=lambda: any(e.running() for e in self.exports),
            log=self.log,
        )

    def done(self, stage: str) -> None:
        """`stage` of the plan is over."""
        if stage in self.todo:
            self.todo.remove(stage)


def torch_peers(run: Run, ck: Path, label: str, cfg: dict, shapes, mode: str):
    """The PyTorch peers of one model in `mode` (eager, or compile: torch.compile, a shape
    starting only where its compile, estimated from the cut's, fits), per attention and dtype."""
    import torch

    a = run.args
    dtypes = list(dict.fromkeys(a.dtypes + (["float32"] if a.fp32 else [])))
    layers = cfg["num_hidden_layers"]
    if mode not in a.peers:
        return

    def estimate() -> float:
        known = [s * layers / n for n, s in run.compiles.items()]
        return max(known) if known else 0.0

    for attn in a.attn:
        module = load_module(ck, attn)
        if isinstance(module, str):
            yield {"model": label, "path": f"torch {attn}", "error": module}
            continue
        for dtype in dtypes:
            module.to(torch.device(a.device), getattr(torch, dtype))
            short, base = SHORT.get(dtype, dtype), {"model": label, "layers": layers}
            if mode == "eager":
                yield from torch_rows(module, f"torch {attn} {short}", shapes, run.context(cfg), base=base)
                continue
            name = f"torch.compile{'' if attn == 'eager' else ' ' + attn} {short}"
            for row in torch_rows(
                module, name, shapes, run.context(cfg), a.compile_backend, estimate, base=base
            ):
                if "compile_s" in row and layers not in run.compiles:
                    run.compiles[layers] = row["compile_s"]
                yield row
        del module
        if a.device == "cuda":
            torch.cuda.empty_cache()


def engine(run: Run, export: Export, label: str, cfg: dict, shapes, reference) -> None:
    """The engine's rows on `export`, opened as `Pruner.load` opens it on this device (and
    with ONNX Runtime's TensorRT provider, with --tensorrt)."""
    from engine.pipeline.encode import BatchingConfig
    from engine.pruner import Pruner

    a = run.args
    if not export.ready:
        why = export.row().get("error") or export.row().get("skipped") or "not ready"
        run.emit(
            {
                "model": label,
                "path": f"onnxruntime-{a.device} {export.precision}",
                "skipped": f"no {export.precision} export ({why})",
            }
        )
        return
    # a budget that holds every shape measured (the GPU graph's fixed shapes are sized by it)
    batching = BatchingConfig(
        max_batch_tokens=max([16384] + [b * n for b, n in shapes]),
        max_batch_size=max([64] + [b for b, _ in shapes]),
    )
    base = {"model": label, "layers": cfg["num_hidden_layers"]}
    variants = [(f"onnxruntime-{a.device} {export.precision}", {})]
    if a.tensorrt and a.device == "cuda":
        variants.append((f"onnxruntime-tensorrt {export.precision}", {"tensorrt": True}))
    manifest = json.loads((export.out / "manifest.json").read_text())
    for path, extra in variants:

        def make(extra=extra):
            gpu_graph = manifest.get("gpu_graph") and not extra and (a.device == "cuda" or a.fixed_shapes)
            if (
                gpu_graph
            ):  # as Pruner.load opens it, but each shape captured when its row starts (timed apart)
                from engine.backends.gpu_graph import GpuGraphBackend

                return GpuGraphBackend(
                    export.out / manifest["graph"],
                    manifest["buckets"],
                    device=a.device,
                    batching=batching,
                    warm="lazy",
                    log=run.log,
                )
            return Pruner.load(export.out, device=a.device, batching=batching, log=run.log, **extra).backend

        for row in engine_rows(make, path, shapes, run.context(cfg, engine=True), reference, base=base):
            run.emit(row)


def check_shape(shapes) -> tuple[int, int]:
    """The timed shape the fidelity check runs at (no session is made for it alone): at the
    shortest length, the most rows up to 16."""
    length = min(n for _, n in shapes)
    return max(
        (b for b, n in shapes if n == length and b <= 16), default=min(b for b, n in shapes if n == length)
    ), length


def reference(ck: Path, shapes, device: str) -> tuple | None:
    """The fidelity check's batch (at a timed shape) and the fp32 PyTorch module's
    probabilities on it (on `device`; TF32 off, as PyTorch's default)."""
    module = load_module(ck, "eager")
    if isinstance(module, str):
        return None
    rows, length = check_shape(shapes)
    return reference_probs(module, rows, length, int(config(ck)["vocab_size"]), device)


def beside(run: Run, export: Export, pending, deadline: float) -> None:
    """While `export` runs (the GPU idle), the next rows of torch eager (short cases: the
    engine's rows start soon after the export ends); then wait for it until `deadline`
    (stopped there) and report it."""
    while export.running() and run.budget.allows():
        row = next(pending, None)
        if row is None:
            break
        run.emit(row)
    export.wait(deadline)
    run.emit(export.row())


def measure_cut(run: Run, sizes: dict, layers: int):
    """The cut: its fp16 export (its PyTorch peers meanwhile), the engine's rows as soon as
    it is done; returns the peers' remaining rows (eager, then torch.compile), which run after
    the full model's engine rows."""
    a = run.args
    label = f"{layers}-layer cut"
    ck, row = checkpoint(run.work / "cut-checkpoint", {**sizes, "num_hidden_layers": layers}, label)
    run.emit(row)
    cfg = config(ck)
    pending = torch_peers(run, ck, label, cfg, a.cut_shapes, "eager")
    if not a.no_onnxruntime:
        export = Export(label, ck, run.work / "cut-fp16", "fp16", run.logs, run.log)
        run.exports.append(export)
        if run.budget.allows():
            export.begin()
        beside(run, export, pending, run.budget.end - run.budget.reserve)
        engine(run, export, label, cfg, a.cut_shapes, reference(ck, a.cut_shapes, a.device))
    run.done(f"{label}: engine fp16")

    def later():
        yield from itertools.chain(pending, torch_peers(run, ck, label, cfg, a.cut_shapes, "compile"))
        run.done(f"{label}: torch")

    return later()


def measure_full(run: Run, ck: Path, after_engine=()) -> None:
    """The full model: its PyTorch peers while its export runs, the engine's rows once it
    is done (fp32 last, with --fp32), then `after_engine` (the cut's torch.compile) and the
    peers' remaining shapes: no torch.compile before the engine's rows."""
    a, label, cfg = run.args, run.full, config(ck)
    shapes = [(b, n) for n in a.lengths for b in a.batches]
    pending = torch_peers(run, ck, label, cfg, shapes, "eager")
    ref = reference(ck, shapes, a.device) if not a.no_onnxruntime else None
    for export in [e for e in run.exports if e.label == label]:
        if export.began is None and run.budget.allows():
            export.begin()  # fp32 after fp16: one export at a time beside the cases
        beside(run, export, pending, run.budget.end - run.floor())
        engine(run, export, label, cfg, shapes, ref)
        run.done(f"{label}: engine {export.precision}")
    for row in itertools.chain(
        after_engine, pending, torch_peers(run, ck, label, cfg, a.compile_shapes, "compile")
    ):
        run.emit(row)
    run.done(f"{label}: torch")


def full_size_check(run: Run, ck: Path) -> None:
    """The full model's memory per captured shape and a captured full-size shape against fp32
    PyTorch (benchmarks/gpu_run/serving.py), once its fp16 export is done and where the budget
    has room for it."""
    from benchmarks.gpu_run.check import row
    from benchmarks.gpu_run.serving import check_full_size

    export = next((e for e in run.exports if e.label == run.full and e.precision == "fp16"), None)
    if export is None or run.args.no_check:
        return
    if not export.ready:
        run.emit(row("full size", "SKIP", "no fp16 export of the full model", skipped="no export"))
    elif run.budget.left() - run.floor() <= 60:
        run.emit(
            row("full size", "SKIP", "not started: the budget was spent", skipped="the budget was spent")
        )
    else:
        try:
            run.emit(check_full_size(export.out / "model.onnx", ck, run.args.device))
        except Exception as exc:
            run.emit(row("full size", "FAIL", f"{type(exc).__name__}: {str(exc)[:300]}"))
    run.done("full-size check")


def plan(run: Run) -> None:
    """The run, in order (the module's docstring)."""
    a = run.args
    sizes = TINY_SIZES if a.tiny else LARGE_SIZES
    layers = sizes["num_hidden_layers"]
    cut = min(a.cut_layers, layers - 1) if a.cut_layers > 0 else 0
    run.full = label = f"{layers} layers"
    precisions = ["fp16"] + (["fp32"] if a.fp32 else [])
    engine_stages = [f"{label}: engine {p}" for p in precisions] if not a.no_onnxruntime else []
    run.todo = (
        (["GPU check"] if not a.no_check and not a.no_onnxruntime else [])
        + ([f"{cut}-layer cut: engine fp16", f"{cut}-layer cut: torch"] if cut else [])
        + [f"{label}: torch"]
        + engine_stages
        + (["full-size check"] if not a.no_check and not a.no_onnxruntime else [])
        + (["prune bench"] if a.rag_data else [])
    )
    ck, row = checkpoint(run.work / "checkpoint", sizes, label)
    run.emit(row)
    if not a.no_onnxruntime:
        run.exports += [
            Export(label, ck, run.work / p, p, run.logs, run.log, background=True) for p in precisions
        ]
        run.exports[0].begin()  # fp16 now, in the background
    if not a.no_check and not a.no_onnxruntime:
        from benchmarks.gpu_run.check import run_checks

        run_checks(
            a.device,
            run.work / "check",
            run.emit,
            run.log,
            lambda seconds: run.budget.left() - run.floor() > seconds,
        )
        run.done("GPU check")
    later = measure_cut(run, sizes, cut) if cut else ()
    measure_full(run, ck, later)
    full_size_check(run, ck)
    if a.rag_data:
        run_bench(run, ck)


def main(argv=None) -> int:
    """Run the plan; the report is written whatever stops it."""
    args = parse(argv)
    run = Run(args, argv)

    def stop(signum, frame):
        raise SystemExit(f"stopped by {signal.Signals(signum).name}")

    before = signal.signal(signal.SIGTERM, stop)
    status = 0
    try:
        plan(run)
    except SystemExit as exc:
        run.info["stopped"] = f"{exc} after {time.time() - run.budget.began:.0f} s"
        run.log(run.info["stopped"])
    except Exception as exc:  # listed in the report, which is still written
        import traceback

        run.info["stopped"] = f"{type(exc).__name__} after {time.time() - run.budget.began:.0f} s"
        run.rows.append(
            {
                "kind": "run",
                "path": "the run",
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "traceback": traceback.format_exc()[-2000:],
            }
        )
        run.log(traceback.format_exc())
        status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the report is written in full
        finish(run)
        signal.signal(signal.SIGTERM, before)
    return status


def finish(run: Run) -> None:
    """Exports still running are stopped, prune bench is waited for, the parts of the plan
    not reached are listed, the report and plot written."""
    why = run.info.get("stopped") or "the run ended"
    for export in run.exports:
        if export.running():
            export.stop(why)
            run.rows.append(export.row())
    stop_bench(run, 7)  # SIGTERM reached it too (timeout signals the group): it writes its report
    read_bench(run)
    for stage in run.todo:
        run.rows.append({"kind": "stage", "path": stage, "skipped": f"not reached or not finished: {why}"})
    run.save()
    if run.args.plot and not plot(run.report, run.args.plot):
        run.log("no plot: matplotlib is not installed, or nothing was measured")


if __name__ == "__main__":
    sys.exit(main())
