"""`prune export --precision auto` on an LLMLingua-2 checkpoint: the precision chosen on this machine,
as export/auto.py chooses a pruning model's.

Candidates: fp32 (export/lingua_onnx.py, checked against PyTorch), the dynamic INT8 graph made
from it (the same graph `--precision int8` quantizes) and, with `[openvino]` where the CPU computes
bf16 (AVX512_BF16 or AMX), OpenVINO's bf16 inference of the fp32 graph (ov-bf16: the fp32 export
whose manifest prefers that runtime, which `Compressor.load` honours, as `Pruner.load` does a
pruning export's). INT8 and ov-bf16 are gated against fp32 on word labels
(engine.fidelity_check.lingua_gate on export/lingua_onnx.py's built-in texts at its rates: the gate
`--precision int8` applies); both are timed here with export/auto.py's timing (the model alone
over the built-in texts' chunks, batched as the Compressor batches them, interleaved rounds after an
untimed one, medians); the fastest that passes is written to `--out`, with the candidates' figures,
what was not tried and why, and the machine in its manifest's `auto`.

Not candidates (NOT_TRIED, recorded in `auto.not_tried`): fp16, which is the GPU's graph (ONNX
Runtime's CPU provider runs it slowly, so auto tries it for no family on a CPU), OpenVINO's static
INT8 IRs (ov-int8, ov-int8-bf16), which the Compressor does not run, and ov-bf16 where this machine
cannot run it (the reason is recorded).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from engine.errors import ExportError
from engine.machine.cpu import CpuKind
from engine.pipeline.spec import CompressorManifest, Runtime

#: what `--precision auto` does not try for LLMLingua-2, and why
NOT_TRIED = {
    "fp16": "fp16 is the GPU's graph: ONNX Runtime's CPU provider runs it slowly (docs/precisions.md), so "
    "auto tries it for no family on a CPU (--precision fp16 exports it, behind the same gate)",
    **{
        name: "the Compressor runs OpenVINO's bf16 inference of the fp32 graph (ov-bf16), not its static INT8 IRs"
        for name in ("ov-int8", "ov-int8-bf16")
    },
}
#: the runtime an ov-bf16 candidate (the fp32 export's graph) runs with, and its manifest prefers
OV_BF16 = Runtime("openvino", "bf16")


def choose_lingua_precision(
    checkpoint: str | Path,
    out: str | Path,
    *,
    export_args: dict[str, Any],
    fp32: str | Path | None = None,
    threads: int | None = None,
    repeats: int = 3,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Export fp32 (or take `fp32`, an fp32 export of this checkpoint) and its INT8 graph, gate INT8,
    time both, and write the fastest that passes into `out`; its manifest (whose `auto` says what
    was measured). `export_args`: export_model's (opset, verify, optimize, the INT8 settings ...)."""
    from export.auto import log_table, machine_record, pick, timed
    from export.lingua_onnx import GATE_RATES, TEXTS

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"{out} exists and is not empty: choose another --out, or --overwrite to write into it"
        )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prune-lingua-auto-") as tmp:
        folders = export_candidates(checkpoint, Path(tmp), export_args, fp32, log)
        not_tried = dict(NOT_TRIED)
        ov_missing = ov_bf16_missing()
        if ov_missing is not None:
            not_tried["ov-bf16"] = ov_missing
        for name, why in not_tried.items():
            log(f"auto: {name} not tried ({why})")
        if ov_missing is None:
            folders["ov-bf16"] = folders["fp32"]  # the same graph, run by OpenVINO at bf16
        compressors = _load(folders, threads)
        candidates = gate_candidates(compressors, log)
        chunks = _chunks(compressors["fp32"], TEXTS)
        batches = math.ceil(len(chunks) / min(c.batch_chunks for c in compressors.values()))
        log(
            f"auto: timing {len(compressors)} precisions over {batches} batches, {repeats} interleaved rounds ..."
        )
        timed(_passes(compressors, chunks), repeats, candidates)
        picked = pick(candidates)
        log_table(candidates, picked, log)
        passing = [p for p in candidates if candidates[p]["passed"]]
        record = {
            "picked": picked,
            "why": f"the fastest of {', '.join(passing)} (passed the gate) on this CPU",
            "candidates": candidates,
            "gate_data": f"built-in texts (export/lingua_onnx.py) at rates {', '.join(map(str, GATE_RATES))}",
            "gate_documents": len(TEXTS),
            "batches": batches,
            "chunks": len(chunks),
            "threads": threads,
            "not_tried": not_tried,
            "machine": machine_record(CpuKind.here()),
        }
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(folders[picked], out)
        manifest = CompressorManifest.read(out)
        data = {**manifest.data, "auto": record}
        if picked != "fp32":  # the gate it passed, where a `--precision int8` export keeps it
            data["gate"] = {
                k: candidates[picked][k] for k in ("passed", "agreement", "words", "spearman", "reason")
            }
        # ov-bf16: the fp32 graph, its manifest preferring OpenVINO's bf16 inference
        runtime = OV_BF16 if picked == "ov-bf16" else manifest.runtime
        dataclasses.replace(manifest, data=data, runtime=runtime).write(out)
    log(f"auto: picked {picked} ({record['why']}); wrote {out} in {time.perf_counter() - t0:.1f} s")
    return CompressorManifest.read(out).data


def export_candidates(
    checkpoint: str | Path,
    tmp: Path,
    export_args: dict[str, Any],
    fp32: str | Path | None,
    log: Callable[[str], None],
) -> dict[str, Path]:
    """The candidates' folders: fp32 (exported into `tmp`, or `fp32` as it is, checked to be an
    fp32 export of `checkpoint`) and its INT8 graph in `tmp`."""
    from export.lingua_onnx import weights_sha256
    from export.onnx import export_model

    if fp32 is None:
        fp32 = tmp / "fp32"
        log("auto: exporting fp32 ...")
        export_model(
            checkpoint,
            fp32,
            family="llmlingua2",
            precision="fp32",
            log=lambda m: log("    " + m),
            **export_args,
        )
    else:
        fp32 = Path(fp32)
        manifest = CompressorManifest.read(fp32)
        source = (manifest.data.get("source") or {}).get("weights_sha256")
        if manifest.precision != "fp32" or source != weights_sha256(Path(checkpoint)):
            raise ExportError(f"{fp32} is not an fp32 export of {checkpoint}")
        log(f"auto: fp32 is {fp32}")
    log("auto: quantizing int8 (ONNX Runtime dynamic INT8 of the fp32 graph) ...")
    return {"fp32": fp32, "int8": lingua_int8(fp32, tmp / "int8", export_args)}


def lingua_int8(fp32: Path, out: Path, export_args: dict[str, Any]) -> Path:
    """The dynamic INT8 export made from the fp32 export's (optimized) graph, as `--precision int8`
    makes it from the same graph, without loading and tracing the checkpoint again; its check is
    the gate against fp32 (gate_candidates), not PyTorch parity."""
    from export.optimize import quantize_int8

    manifest = CompressorManifest.read(fp32)
    external = manifest.data.get("external_data")
    shutil.copytree(
        fp32, out, ignore=shutil.ignore_patterns(manifest.graph, *([external] if external else []))
    )
    details = quantize_int8(
        fp32 / manifest.graph,
        out / manifest.graph,
        export_args.get("int8_weight_type", "QInt8"),
        export_args.get("int8_per_channel", True),
        bool(external),
    )
    data = {k: v for k, v in manifest.data.items() if k not in ("verification", "verification_steps")}
    data.update(
        quantization=details, external_data=external if external and (out / external).exists() else None
    )
    dataclasses.replace(manifest, precision="int8", data=data).write(out)
    return out


def ov_bf16_missing() -> str | None:
    """Why OpenVINO's bf16 inference cannot run here (not installed, no bf16 on this CPU), or None."""
    from engine.models.loading import runtime_missing

    return runtime_missing(OV_BF16)


def gate_candidates(compressors: dict[str, Any], log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each candidate's runtime and its gate against fp32 (engine.fidelity_check.lingua_gate on the
    built-in texts); fp32 passes as the reference."""
    from engine.fidelity_check import lingua_gate
    from export.lingua_onnx import GATE_RATES, TEXTS

    candidates: dict[str, dict[str, Any]] = {}
    for precision, compressor in compressors.items():
        entry: dict[str, Any] = {"runtime": compressor.describe()}
        if precision == "fp32":
            entry.update(passed=True, reason="the reference")
        else:
            entry.update(lingua_gate(compressors["fp32"], compressor, TEXTS, GATE_RATES))
        candidates[precision] = entry
        log(f"auto: {precision}: {'passes' if entry['passed'] else 'fails'} the gate ({entry['reason']})")
    return candidates


def _load(folders: dict[str, Path], threads: int | None) -> dict[str, Any]:
    """The candidates' compressors; ov-bf16 (the fp32 export's folder) on OpenVINO's bf16 inference,
    what its manifest's runtime makes Compressor.load run once picked."""
    from engine.compressor import Compressor

    return {
        p: Compressor.load(f, threads=threads, **(dataclasses.asdict(OV_BF16) if p == "ov-bf16" else {}))
        for p, f in folders.items()
    }


def _chunks(compressor: Any, texts: list[str]) -> list:
    """The texts' chunks as the compressor makes them (force token "\\n", as the gate)."""
    from engine.pipeline.lingua_decide import CompressOptions, plan

    p = plan(compressor.tokenizer, texts, CompressOptions(force_tokens=("\n",)), compressor.count)
    return [c for cs in p.chunks for c in cs]


def _passes(compressors: dict[str, Any], chunks: list) -> dict[str, Callable[[], None]]:
    """For the timing: each compressor's model over `chunks`, batched as its compress batches them."""

    def one_pass(compressor: Any) -> Callable[[], None]:
        def run() -> None:
            compressor._token_probs(chunks)

        return run

    return {p: one_pass(c) for p, c in compressors.items()}
