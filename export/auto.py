"""`prune export --precision auto`: every precision this machine can run, each checked by
the fidelity gate against the fp32 export and timed here; the fastest that passes is
written to `--out`, with what was measured in its manifest (`auto`).

Candidates (which are worth trying on this CPU's kind: engine.machine.cpu): fp32 and dynamic
INT8 on ONNX Runtime; with `[openvino]`, the NNCF static INT8 IR (ov-int8) on OpenVINO
where the CPU has int8 dot products (VNNI or AMX) and, where it computes bf16 (AVX512_BF16 or AMX),
OpenVINO's bf16 inference of the fp32 graph (ov-bf16: the fp32 export whose manifest
prefers that runtime, which `Pruner.load` honours) and of what the static INT8 IR keeps
float (ov-int8-bf16: the IR, preferring bf16). OpenVINO's f32 inference is not a
candidate: it runs the fp32 graph at ONNX Runtime's fp32 speed (docs/performance.md), and
a tie would tie the export to OpenVINO for nothing.

The gate is `prune fidelity`'s (engine.fidelity_check.GATE): at least 99% of sentence
decisions the same as fp32's at the family's threshold, and a Spearman correlation of
the reranking scores of at least 0.99. It is measured on `gate_data` (a JSONL that
`prune fidelity --data` reads: bring your own domain's), else on the built-in generic
calls below (never the calibration text, never evaluation data). Speed: each candidate's
model alone over the same padded batches of those calls, interleaved rounds, medians, on
this machine's cores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from engine.machine.cpu import BF16_MISSING, CpuKind
from engine.errors import ExportError
from engine.pipeline.spec import Manifest, Runtime

#: Generic RAG calls for the gate: a question, the passage that answers it and two that do
#: not. Written for this purpose; apart from the calibration text (export/ov_int8.py).
GATE_CALLS: list[tuple[str, list[str]]] = [
    (
        "How do bees find their way back to the hive?",
        [
            "Honey bees navigate with the sun as a compass. They correct for its movement across the sky during the day. "
            "On cloudy days they read the pattern of polarised light. Near the hive they also remember landmarks such as "
            "trees and buildings. Returning foragers tell others where food is with a waggle dance.",
            "The price of honey rose last year after a cold spring. Many small producers sold out by autumn. Imports "
            "filled part of the gap. Supermarkets raised their prices twice. Analysts expect a better harvest next year.",
            "Beeswax is used in candles, cosmetics and polishes. It melts at about sixty-two degrees. Candle makers "
            "prize its slow, clean burn. It is also used to waterproof cloth. Some artists paint with it.",
        ],
    ),
    (
        "What caused the bridge to close?",
        [
            "The city council met on Tuesday to discuss the budget. Members argued about funding for parks. A vote on "
            "the library was postponed. The meeting ran past midnight. The next session is in two weeks.",
            "Engineers closed the river bridge on Monday after inspectors found cracks in two steel supports. The cracks "
            "were traced to corrosion from road salt. Traffic was diverted to the northern crossing. Repairs are expected "
            "to take three months. Buses will run a shuttle service meanwhile.",
            "The bridge was opened in 1958 by the mayor. At the time it was the longest span in the region. It carries "
            "about forty thousand cars a day. A bicycle lane was added in 2004. The structure is painted green every "
            "ten years.",
        ],
    ),
    (
        "Why is the sky blue?",
        [
            "Sunlight contains every colour of the rainbow. When it enters the atmosphere it meets molecules of nitrogen "
            "and oxygen. Short blue wavelengths are scattered far more than long red ones. This scattered blue light "
            "reaches our eyes from every direction. At sunset the light travels further and the reds remain.",
            "Painters have mixed blue pigments from minerals for centuries. Ultramarine was once ground from lapis lazuli. "
            "It cost more than gold in some periods. Synthetic versions appeared in the nineteenth century. Today most "
            "blue paint is made in factories.",
            "Weather forecasts give the chance of rain as a percentage. A seventy percent chance means rain is likely. "
            "Forecasts are less reliable beyond five days. Satellites track clouds around the world. Local radar shows "
            "showers in real time.",
        ],
    ),
    (
        "When should tomatoes be planted outside?",
        [
            "Tomatoes are tender plants that are killed by frost. Gardeners usually plant them outside after the last "
            "frost of spring. The soil should have warmed to at least fifteen degrees. Young plants are first hardened "
            "off for a week. In cool regions they grow better in a greenhouse.",
            "A tomato is botanically a fruit. In cooking it is treated as a vegetable. It came to Europe from the "
            "Americas in the sixteenth century. Some people first thought it was poisonous. It is now grown on every "
            "continent except Antarctica.",
            "Compost improves the structure of most soils. It is made from kitchen and garden waste. A heap should be "
            "turned every few weeks. Good compost smells earthy, not sour. It is ready in six to twelve months.",
        ],
    ),
    (
        "Who invented the telephone?",
        [
            "Alexander Graham Bell was granted the first patent for the telephone in 1876. Elisha Gray filed a similar "
            "design on the same day. Antonio Meucci had built voice devices years earlier. Historians still debate who "
            "deserves the credit. Bell's company grew into a vast network.",
            "Mobile phones became common in the 1990s. Early models were large and heavy. Text messages were limited "
            "to a few characters. Smartphones added cameras and maps. Most adults now carry one.",
            "The postal service delivered letters long before the telephone. Stamps were introduced in 1840. Mail "
            "coaches carried post between cities. Railways later made delivery faster. Airmail followed in the "
            "twentieth century.",
        ],
    ),
    (
        "How much water should an adult drink each day?",
        [
            "Running shoes should be replaced every few hundred miles. Worn soles give less support. Many runners keep "
            "two pairs and alternate them. Shops can analyse the way you run. A good fit matters more than the brand.",
            "Health agencies suggest that adults drink roughly two litres of fluid a day. Needs are higher in hot "
            "weather and during exercise. Food provides about a fifth of daily water. Thirst is a reliable guide for "
            "most healthy people. Older adults may need reminders to drink.",
            "Tap water in most cities is tested every day. It is treated to remove bacteria. Some regions add "
            "fluoride. Hard water contains more calcium and magnesium. Filters can improve the taste.",
        ],
    ),
    (
        "What does the central bank do when inflation rises?",
        [
            "When inflation rises above its target, a central bank usually raises its interest rate. Borrowing becomes "
            "more expensive for households and firms. Spending slows and price growth eases. The effect takes a year "
            "or more to show. Banks also signal their plans to guide expectations.",
            "Coins were first minted in Lydia around the seventh century before the common era. They were made of "
            "electrum. Paper money appeared later in China. Banknotes spread to Europe in the seventeenth century. "
            "Many payments today are electronic.",
            "A household budget lists income and regular spending. Rent and food usually come first. Saving a fixed "
            "share of income helps in emergencies. Apps can track expenses automatically. Reviewing the budget monthly "
            "keeps it realistic.",
        ],
    ),
    (
        "Which planet has the most moons?",
        [
            "Mars has two small moons named Phobos and Deimos. They may be captured asteroids. Phobos is slowly "
            "spiralling inward. Deimos orbits further out. Both are darker than coal.",
            "Saturn has the largest known number of moons, with well over a hundred confirmed. Astronomers added dozens "
            "in recent surveys. Most are only a few kilometres across. Titan, the largest, has a thick atmosphere. "
            "Jupiter is second on the list.",
            "Telescopes for amateurs come in two main types. Refractors use lenses. Reflectors use mirrors and cost less "
            "for their size. A steady mount matters as much as the optics. Dark skies away from cities show the most "
            "stars.",
        ],
    ),
]


def gate_docs(gate_data: str | Path | None = None):
    """The documents the gate is measured on: `gate_data` (`prune fidelity --data`'s formats)
    or the built-in calls, one document per passage."""
    from engine.fidelity_check import Doc, load_docs

    if gate_data is not None:
        docs = load_docs(gate_data)
        if not docs:
            raise ExportError(f"{gate_data}: no documents to measure the gate on")
        return docs
    return [Doc(q, p, None) for q, passages in GATE_CALLS for p in passages]


@dataclass
class Candidates:
    """The candidates exported for a CPU of `kind`: each one's folder, the runtime of those
    that run a graph another way than its export says, and what was not tried, and why."""

    kind: CpuKind
    folders: dict[str, Path] = field(default_factory=dict)
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    not_tried: dict[str, str] = field(default_factory=dict)


def choose_precision(
    checkpoint: str | Path,
    out: str | Path,
    *,
    export_args: dict[str, Any],
    calibration: list[str] | None = None,
    gate_data: str | Path | None = None,
    threads: int | None = None,
    repeats: int = 3,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    cpu: CpuKind | None = None,
) -> Manifest:
    """Export every candidate precision worth trying on this CPU (`cpu`: its kind, from its
    flags), gate and time each, and write the fastest that passes into `out`; its manifest,
    whose `auto` records the candidates' figures and what was not tried, and why."""
    from engine.pruner import Pruner

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"{out} exists and is not empty: choose another --out, or --overwrite to write into it"
        )
    docs = gate_docs(gate_data)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prune-auto-") as tmp:
        found = export_candidates(
            checkpoint, Path(tmp), cpu or CpuKind.here(), export_args, calibration, progress, log
        )
        pruners = {
            p: Pruner.load(f, threads=threads, **_load_args(found.runtimes.get(p)))
            for p, f in found.folders.items()
        }
        candidates = gate_candidates(pruners, docs, log)
        batches = time_candidates(pruners, docs, repeats, candidates, log)
        picked = pick(candidates)
        passing = [p for p in candidates if candidates[p]["passed"]]
        log_table(candidates, picked, log)
        record = {
            "picked": picked,
            "why": f"the fastest of {', '.join(passing)} (passed the gate) on this CPU",
            "candidates": candidates,
            "gate_data": str(gate_data) if gate_data else "built-in generic calls",
            "gate_documents": len(docs),
            "batches": batches,
            "threads": threads,
            "not_tried": found.not_tried,
            "machine": machine_record(found.kind),
        }
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(found.folders[picked], out)
        manifest = Manifest.read(out)
        manifest.with_changes(
            runtime=found.runtimes.get(picked), data={**manifest.data, "auto": record}
        ).write(out)
    log(f"auto: picked {picked} ({record['why']}); wrote {out} in {time.perf_counter() - t0:.1f} s")
    return Manifest.read(out)


def export_candidates(
    checkpoint: str | Path,
    tmp: Path,
    kind: CpuKind,
    export_args: dict[str, Any],
    calibration: list[str] | None,
    progress: bool,
    log: Callable[[str], None],
) -> Candidates:
    """Every candidate worth trying on a CPU of `kind`, exported into `tmp`: fp32 (checked
    against PyTorch), its dynamic INT8, and with OpenVINO the static INT8 IR and the bf16
    inference of both where they are worth it; what was not tried is logged, with why."""
    from export.onnx import export_model

    found = Candidates(kind, {"fp32": tmp / "fp32", "int8": tmp / "int8"})
    log("auto: exporting fp32 ...")
    export_model(checkpoint, found.folders["fp32"], precision="fp32", log=_indent(log), **export_args)
    if Manifest.read(found.folders["fp32"]).external_data:  # over 2 GB: the exporter writes its data files
        log("auto: exporting int8 ...")
        export_model(checkpoint, found.folders["int8"], precision="int8", log=_indent(log), **export_args)
    else:
        log("auto: quantizing int8 (ONNX Runtime dynamic INT8 of the fp32 graph) ...")
        int8_from(found.folders["fp32"], found.folders["int8"], export_args)
    found.not_tried = {p: why for p, why in kind.auto_candidates(_openvino_installed()).items() if why}
    if not kind.known:
        from engine.machine.cpu import FLAGS_UNKNOWN

        log(f"auto: {FLAGS_UNKNOWN}")
    if "ov-int8" not in found.not_tried:
        from export.ov_int8 import quantize

        log("auto: quantizing ov-int8 (NNCF static INT8 for OpenVINO) ...")
        quantize(
            found.folders["fp32"], tmp / "ov-int8", texts=calibration, progress=progress, log=_indent(log)
        )
        found.folders["ov-int8"] = tmp / "ov-int8"
    _bf16_candidates(found)
    for name, why in found.not_tried.items():
        log(f"auto: {name} not tried ({why})")
    return found


def _bf16_candidates(found: Candidates) -> None:
    """OpenVINO's bf16 inference of the fp32 graph (ov-bf16) and of what the static INT8 IR
    keeps float (ov-int8-bf16), added to `found` where their graph was exported and
    OpenVINO's plugin computes bf16 here; else to its `not_tried`, with why."""
    folders, not_tried = found.folders, found.not_tried
    for name, graph in (("ov-bf16", "fp32"), ("ov-int8-bf16", "ov-int8")):
        if name not in not_tried and graph not in folders:
            not_tried[name] = f"{graph} was not tried"
        elif name not in not_tried:
            from engine.backends.openvino import bf16_supported

            if bf16_supported():  # the flags say so; OpenVINO's plugin must agree
                found.runtimes[name] = Runtime("openvino", "bf16")
                folders[name] = folders[graph]
            else:
                not_tried[name] = f"OpenVINO's CPU plugin: {BF16_MISSING}"


def gate_candidates(pruners: dict[str, Any], docs, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each candidate's runtime and its gate against fp32 on `docs` (engine.fidelity_check); fp32
    passes as the reference."""
    from engine.fidelity_check import gate, measure

    reference = pruners["fp32"]
    candidates: dict[str, dict[str, Any]] = {}
    for precision, pruner in pruners.items():
        entry: dict[str, Any] = {"runtime": pruner.backend.describe()}
        if precision != "fp32":
            report = measure(pruner, reference, docs, progress=False, log=lambda m: None)
            entry.update(gate(report, pruner.family.rules.threshold))
        else:
            entry.update(passed=True, reason="the reference")
        candidates[precision] = entry
        log(f"auto: {precision}: {'passes' if entry['passed'] else 'fails'} the gate ({entry['reason']})")
    return candidates


def time_candidates(
    pruners: dict[str, Any],
    docs,
    repeats: int,
    candidates: dict[str, dict[str, Any]],
    log: Callable[[str], None],
) -> int:
    """Each candidate's model alone over the same padded batches of the gate's calls,
    interleaved rounds, medians (engine.machine.timing): its `seconds` and `speedup` over fp32, in
    its entry of `candidates`; the number of batches."""
    from engine.machine.timing import model_passes
    from engine.measuring import workload_batches

    calls = [SimpleNamespace(question=q, passages=ps) for q, ps in _calls(docs)]
    batches = workload_batches(pruners["fp32"], calls)
    log(
        f"auto: timing {len(pruners)} precisions over {len(batches)} batches, {repeats} interleaved rounds ..."
    )
    timed(model_passes(pruners, batches), repeats, candidates)
    return len(batches)


def timed(passes: dict[str, Callable[[], Any]], repeats: int, candidates: dict[str, dict[str, Any]]) -> None:
    """Each candidate's pass (`passes`, by precision, fp32 among them) timed in interleaved rounds
    after an untimed one (engine.machine.timing), medians: its `seconds`, `speedup` over fp32 and
    `spread` ((max - min) / median) in its entry of `candidates`."""
    from engine.machine.timing import interleave, medians

    rounds = interleave(passes, repeats, log=lambda m: None, warmup=True)
    times = medians(rounds)
    for precision, seconds in times.items():
        spread = (max(rounds[precision]) - min(rounds[precision])) / seconds if seconds else 0.0
        candidates[precision].update(
            seconds=round(seconds, 4), speedup=round(times["fp32"] / seconds, 3), spread=round(spread, 4)
        )


def log_table(candidates: dict[str, dict[str, Any]], picked: str, log: Callable[[str], None]) -> None:
    """The candidates' times, speed-ups and gates, one line each; the pick marked."""
    width = max(map(len, candidates))
    for precision in candidates:
        c = candidates[precision]
        log(
            f"  {precision:{width}s} {c['seconds'] * 1000:8.1f} ms (spread {c.get('spread', 0):.0%})  "
            f"{c['speedup']:.2f}x  "
            f"{'gate passed' if c['passed'] else 'gate FAILED'}{'  <- picked' if precision == picked else ''}"
        )


def machine_record(kind: CpuKind) -> dict[str, Any]:
    """The machine in the record: the CPU's model (where it says), its cores, kind and flags."""
    from engine.machine.timing import cpu_model

    model = cpu_model()
    return {
        **({"cpu_model": model} if model is not None else {}),
        "cpus": os.cpu_count(),
        "cpu_kind": kind.name,
        "cpu_flags": kind.shown_flags(),
    }


def int8_from(fp32: Path, out: Path, export_args: dict[str, Any]) -> Path:
    """The dynamic INT8 export made from the fp32 export's (optimized) graph, as
    `export_model(precision="int8")` makes it from the same graph, without loading and
    tracing the checkpoint again; its check is the gate against fp32, not PyTorch parity."""
    from export.optimize import quantize_int8

    manifest = Manifest.read(fp32)
    if manifest.external_data:
        raise ExportError(f"{fp32}: its graph keeps its weights apart; export int8 with export_model")
    shutil.copytree(fp32, out, ignore=shutil.ignore_patterns(manifest.graph))
    details = quantize_int8(
        fp32 / manifest.graph,
        out / manifest.graph,
        export_args.get("int8_weight_type", "QInt8"),
        export_args.get("int8_per_channel", True),
    )
    data = {k: v for k, v in manifest.data.items() if k not in ("verification", "verification_steps")}
    manifest.with_changes(
        precision="int8", data={**data, "precision": "int8", "quantization": details}
    ).write(out)
    return out


#: the least gain that moves an export to another runtime: the candidates' own run-to-run
#: spread decides when it is larger (`pick`)
SWITCH_MARGIN = 0.03


def pick(candidates: dict[str, dict[str, Any]]) -> str:
    """The fastest candidate (least `seconds`) of those whose gate `passed`; but one on
    another runtime than ONNX Runtime's best (OpenVINO's "ov-" candidates) only when it is
    faster by more than run-to-run noise: its and that one's `spread` over the timing's
    rounds ((max - min) / median), and at least SWITCH_MARGIN."""
    passing = [p for p, c in candidates.items() if c["passed"]]
    if not passing:
        raise ExportError("no precision passed the fidelity gate, not even the reference")
    fastest = min(passing, key=lambda p: candidates[p]["seconds"])
    onnxruntime = [p for p in passing if not p.startswith("ov-")]
    if not fastest.startswith("ov-") or not onnxruntime:
        return fastest
    home = min(onnxruntime, key=lambda p: candidates[p]["seconds"])
    margin = max(SWITCH_MARGIN, candidates[fastest].get("spread", 0.0), candidates[home].get("spread", 0.0))
    return fastest if candidates[fastest]["seconds"] < candidates[home]["seconds"] * (1 - margin) else home


def _openvino_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def _load_args(runtime: Runtime | None) -> dict[str, str]:
    """Pruner.load's runtime arguments of a candidate: its runtime, else ONNX Runtime (an
    IR export runs on OpenVINO whatever this says)."""
    if runtime is None:
        return {"backend": "onnxruntime"}
    return {"backend": runtime.backend, "precision": runtime.precision}


def _calls(docs) -> list[tuple[str, list[str]]]:
    """Documents back into calls (consecutive documents of one question)."""
    calls: list[tuple[str, list[str]]] = []
    for d in docs:
        if calls and calls[-1][0] == d.question:
            calls[-1][1].append(d.context)
        else:
            calls.append((d.question, [d.context]))
    return calls


def _indent(log: Callable[[str], None]) -> Callable[[str], None]:
    return lambda m: log("    " + m)
