"""The LLMLingua-2 benchmark's report (engine.bench.lingua): its figures (the checkpoint, the
prompts, a row per path and prompt, the targets, what `--precision auto` picked) and its markdown,
under the command and the machine (engine.bench.harness.Study writes bench.json and bench.md)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

#: the engine's paths (engine.bench.lingua's registry): the CPU's, then the GPU's (--device cuda)
ORT_FP32, ORT_AUTO = "engine onnxruntime fp32", "engine onnxruntime auto"
CUDA_FP32, GPU_GRAPH = "engine onnxruntime cuda fp32", "engine gpu graph fp16"
#: what the engine aims at, reported against (not asserted): (path, least ratio to the reference,
#: whether the output must be identical)
TARGETS = (
    (ORT_FP32, 1.5, True),
    (ORT_AUTO, 3.0, False),
    (GPU_GRAPH, 10.0, False),  # --device cuda: where the reference's loops dominate (#62)
)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _checkpoint(folder: Path) -> dict[str, Any]:
    """The checkpoint's layout (config.json) and its tokenizer's size."""
    from engine.pipeline.lingua_words import LinguaTokenizer

    config = json.loads((Path(folder) / "config.json").read_text())
    keys = (
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    )
    tok = LinguaTokenizer.from_folder(folder)
    return {
        "path": str(folder),
        **{k: config.get(k) for k in keys},
        "tokenizer": tok.kind,
        "tokenizer_ids": tok.size - 100,  # without llmlingua's [NEW0]..[NEW99]
    }


def _model_side(session: Any, text: str) -> dict[str, int]:
    """A prompt's model tokens (with each chunk's two special tokens) and chunks, as the engine's
    compressors cut it (none started: empty)."""
    from engine.pipeline.lingua_decide import CompressOptions, plan

    compressor = session.a_compressor()
    if compressor is None:
        return {}
    p = plan(
        compressor.tokenizer,
        [text],
        CompressOptions(force_tokens=session.options.force_tokens),
        compressor.count,
    )
    chunks = [c for cs in p.chunks for c in cs]
    return {"model_tokens": sum(len(c.ids) for c in chunks), "chunks": len(chunks)}


def _auto(session: Any) -> dict[str, Any] | None:
    """What the auto export picked and its candidates' figures (its manifest's `auto`)."""
    folder = session.exports().get("auto")
    if folder is None or not (Path(folder) / "manifest.json").is_file():
        return None
    manifest = json.loads((Path(folder) / "manifest.json").read_text())
    auto = manifest.get("auto") or {}
    keep = ("passed", "seconds", "speedup", "agreement", "words", "spearman", "reason")
    return {
        "folder": str(folder),
        "precision": manifest.get("precision"),
        "picked": auto.get("picked"),
        "candidates": {
            p: {k: c[k] for k in keep if k in c} for p, c in (auto.get("candidates") or {}).items()
        },
        "not_tried": auto.get("not_tried"),
    }


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target against each prompt's row: the ratio, the output, met or not."""
    out = []
    for path, least, identical in TARGETS:
        for r in rows:
            if r["path"] != path or r.get("vs_reference") is None:
                continue
            met = r["vs_reference"] >= least and (not identical or bool(r.get("identical")))
            out.append(
                {
                    "path": path,
                    "workload": r["workload"],
                    "target": f">= {least}x the reference" + (" with identical output" if identical else ""),
                    "vs_reference": r["vs_reference"],
                    "identical": r.get("identical"),
                    "met": met,
                }
            )
    return out


def figures(session: Any, paths: list, work: list, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's figures (bench.json beside the command, machine and date)."""
    o = session.options
    return {
        "settings": {
            "checkpoint": _checkpoint(o.checkpoint),
            "data": str(o.data),
            "rate": o.rate,
            "force_tokens": list(o.force_tokens),
            "repeats": o.repeats,
            "threads": o.threads,
            "device": o.device,
            "paths": [p.name for p in paths],
            "exports": {w: str(f) for w, f in session.exports().items()},
            "versions": {p: _version(p) for p in ("llmlingua", "transformers", "tokenizers", "tiktoken")},
        },
        "workloads": [
            {
                "name": w.name,
                "origin_tokens": w.tokens,
                "contexts": w.contexts,
                **_model_side(session, w.text),
            }
            for w in work
        ],
        "rows": rows,
        "targets": targets(rows),
        "auto": _auto(session),
        "not_measured": dict(session.reasons),
        "notes": list(session.notes),
    }


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _in_model(r: dict[str, Any]) -> str:
    m = r.get("model_seconds_median")
    return "-" if m is None else f"{m:.3f} ({100 * m / r['seconds_median']:.0f}%)"


def _agreement(r: dict[str, Any]) -> str:
    if "word_agreement" not in r:
        return "-"
    if r["word_agreement"] is None:
        return "the words differ"
    return f"{100 * r['word_agreement']:.2f}% of {r['words']}"


def markdown(rep: dict[str, Any], header: list[str]) -> list[str]:
    """The report's markdown lines below `header` (Study.header: title, command, machine)."""
    s, c = rep["settings"], rep["settings"]["checkpoint"]
    lines = header + [
        f"Checkpoint: `{c['path']}` ({c['model_type']}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
        f"{c['num_attention_heads']} heads, intermediate {c['intermediate_size']}, vocabulary {c['vocab_size']:,}; "
        f"its {c['tokenizer']} tokenizer has {c['tokenizer_ids']:,} ids, and llmlingua's 100 added tokens). "
        f"Device: {s.get('device', 'cpu')}. "
        f"Prompts: the contexts of `{s['data']}` joined by newlines; rate {s['rate']}, force tokens "
        f"{json.dumps(s['force_tokens'])}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        + ".",
        "",
        "| prompt | origin tokens (tiktoken) | contexts | model tokens | chunks |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {w['name']} | {w['origin_tokens']:,} | {w['contexts']} | {w.get('model_tokens', '-')} | "
        f"{w.get('chunks', '-')} |"
        for w in rep["workloads"]
    ]
    lines += [
        "",
        f"Tokens/s: origin tokens / seconds of one compress call, median of {s['repeats']} interleaved rounds "
        "(after one untimed call per path, which gave the outputs compared here). In the model: the "
        "median of the same calls' seconds in the model (the reference's PyTorch module, the engine's "
        "core), the rest being the text side around it.",
        "",
        "| prompt | path | tokens/s | seconds | in the model | vs reference | compressed_prompt identical "
        "| word labels equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["rows"]:
        identical = "-" if "identical" not in r else ("yes" if r["identical"] else "no")
        lines.append(
            f"| {r['workload']} | {r['path']} | {r['tokens_per_s']:,.0f} | {r['seconds_median']:.3f} | "
            f"{_in_model(r)} | {_ratio(r['vs_reference'])} | {identical} | {_agreement(r)} |"
        )
    lines += _auto_lines(rep.get("auto")) + _target_lines(rep["targets"])
    if rep["not_measured"]:
        lines += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in rep["not_measured"].items()]
    if rep["notes"]:
        lines += [""] + [f"Note: {n}." for n in rep["notes"]]
    return lines


def _auto_lines(auto: dict[str, Any] | None) -> list[str]:
    if not auto:
        return []
    parts = []
    for p, c in auto["candidates"].items():
        gate = (
            ""
            if p == "fp32"
            else (f", word agreement {100 * c['agreement']:.2f}%" if "agreement" in c else "")
        )
        verdict = "passed" if c.get("passed") else "FAILED"
        parts.append(f"{p} {1000 * c.get('seconds', 0):.0f} ms ({verdict} the gate{gate})")
    return [
        "",
        f"`engine onnxruntime auto` ran {auto['picked']} (`{auto['folder']}`): what `--precision auto` picked on "
        f"the machine that exported it, timing the model over its built-in texts: {'; '.join(parts)}.",
    ]


def _target_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    return ["", "Targets (reported, not asserted):", ""] + [
        f"- {t['path']}, {t['workload']}: {t['target']}: {_ratio(t['vs_reference'])}"
        + ("" if t["identical"] is None else f" (output {'identical' if t['identical'] else 'different'})")
        + f": {'met' if t['met'] else 'not met'}"
        for t in rows
    ]
