"""The GPU run's report (gpu.md, gpu.png) from its JSON (gpu.json), rewritten after every
case. Every row is read with `.get`: a row may be a measured case, a fidelity check, an
export, a checkpoint, a case not measured (`skipped`) or one that failed (`error`), and
of any age (the first GPU run's PyTorch rows had `attn` and `dtype`, not `path`): none
of them stops the report from being written."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def _num(value: Any, spec: str = ".1f", unit: str = "") -> str:
    """`value` formatted, or "-" where it is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:{spec}}{unit}"


def _cell(value: Any) -> str:
    """Text for a table cell: no pipe or newline breaks the table."""
    return str(value if value is not None else "-").replace("|", "/").replace("\n", " ")


def path_of(row: dict) -> str:
    """A row's path: its `path`; an old PyTorch row's `torch ATTN DTYPE`; an export's
    `export PRECISION`; else its kind."""
    if row.get("path"):
        return str(row["path"])
    if row.get("kind") == "export":
        return f"export {row.get('precision', '?')}"
    if "attn" in row or "dtype" in row:
        return f"torch {row.get('attn', '?')} {row.get('dtype', '?')}".strip()
    return str(row.get("kind") or "run")


def shape_of(row: dict) -> str:
    """`batch x length`, or what of it the row has."""
    batch, length = row.get("batch"), row.get("length")
    if batch is None and length is None:
        return ""
    return f"{batch if batch is not None else '?'} x {length if length is not None else '?'}"


def label(row: dict) -> str:
    """The row in words: model, path and shape, whichever it has."""
    return " ".join(part for part in (str(row.get("model") or ""), path_of(row), shape_of(row)) if part)


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if isinstance(r.get("ms_per_batch"), (int, float))]


def _table(head: list[str], body: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(_cell(c) for c in cells) + " |" for cells in body
    ]


def _exports(rows: list[dict]) -> list[str]:
    made = [r for r in rows if r.get("kind") in ("export", "checkpoint")]
    if not made:
        return []
    body = []
    for r in made:
        how = (
            "reused: " + str(r.get("reused_because", ""))
            if r.get("reused")
            else "failed: " + str(r["error"])
            if "error" in r
            else "not finished: " + str(r["skipped"])
            if "skipped" in r
            else "made" + (" in the background, beside the cases below" if r.get("background") else "")
        )
        body.append(
            [r.get("model", "-"), r.get("kind"), r.get("precision", "-"), _num(r.get("seconds")), how]
        )
    return ["", "## Checkpoints and exports (`prune export`, counted in the budget)", ""] + _table(
        ["model", "what", "precision", "seconds", "how"], body
    )


def _column(path: str) -> int:
    """The comparison's column order: the engine, torch eager, torch.compile, the rest."""
    return (
        0
        if path.startswith("onnxruntime")
        else 2
        if path.startswith("torch.compile")
        else 1
        if path.startswith("torch")
        else 3
    )


def _pivot(rows: list[dict]) -> list[str]:
    """ms per batch: one line per model and shape, one column per path (the comparison)."""
    timed = _timed(rows)
    if not timed:
        return []
    paths = sorted(dict.fromkeys(path_of(r) for r in timed), key=_column)
    keys = list(dict.fromkeys((str(r.get("model") or "-"), shape_of(r)) for r in timed))
    cell = {(str(r.get("model") or "-"), shape_of(r), path_of(r)): r["ms_per_batch"] for r in timed}
    body = [
        [model, shape] + [_num(cell.get((model, shape, p)), ".2f") for p in paths] for model, shape in keys
    ]
    return ["", "## Milliseconds per batch (median wall time)", ""] + _table(
        ["model", "batch x length"] + paths, body
    )


def _cases(rows: list[dict], peak: Any) -> list[str]:
    timed = _timed(rows)
    if not timed:
        return []
    body = [
        [
            r.get("model", "-"),
            path_of(r),
            shape_of(r),
            _num(r.get("ms_per_batch"), ".2f"),
            _num(r.get("p99_ms"), ".2f"),
            _num(r.get("sequences_per_s")),
            _num(r.get("tokens_per_s"), ".0f"),
            _num(r.get("tflops"), ".1f"),
            _num(
                100 * r["share_of_fp16_peak"]
                if isinstance(r.get("share_of_fp16_peak"), (int, float))
                else None,
                ".1f",
                "%",
            ),
            _num(r.get("compile_s", r.get("first_s")), ".2f"),
            "yes" if r.get("beside_export") else "",
        ]
        for r in timed
    ]
    return [
        "",
        f"## Every case (share of a {_num(peak, '.0f')} TFLOP/s dense fp16 peak; the first run at a shape, "
        "which makes the engine's session or compiles, apart from the timed runs)",
        "",
    ] + _table(
        [
            "model",
            "path",
            "batch x length",
            "ms per batch",
            "p99 ms",
            "sequences/s",
            "tokens/s",
            "TFLOP/s",
            "share of peak",
            "first run s",
            "beside an export",
        ],
        body,
    )


def _checks(rows: list[dict]) -> list[str]:
    checks = [r for r in rows if "max_abs_dprob" in r]
    if not checks:
        return []
    body = [
        [
            r.get("model", "-"),
            path_of(r),
            _num(r.get("max_abs_dprob"), ".2e"),
            r.get("check", "-"),
            ", ".join(map(str, r.get("providers") or [])) or "-",
        ]
        for r in checks
    ]
    backends = [
        f"- {r.get('model', '-')} {path_of(r)}: {r['backend']}"
        for r in rows
        if r.get("kind") == "backend" and r.get("backend")
    ]
    return (
        ["", "## Fidelity", ""]
        + _table(["model", "path", "max abs probability difference", "against", "providers"], body)
        + (["", "The engine's backends, as measured:", ""] + backends if backends else [])
    )


def _gpu_check(rows: list[dict]) -> list[str]:
    checks = [r for r in rows if r.get("kind") == "check"]
    if not checks:
        return []
    return [
        "",
        "## The GPU check (the design on this device, before anything is timed: gpu_run/check.py)",
        "",
    ] + _table(
        ["check", "result", "figure"],
        [[r.get("check", "-"), r.get("result", "-"), r.get("figure", "-")] for r in checks],
    )


def _bench(bench: Any) -> list[str]:
    if not isinstance(bench, dict):
        return []
    lines = ["", "## The RAG workload through the whole engine (`prune bench`)", ""]
    if bench.get("command"):
        lines += [f"`{bench['command']}`", ""]
    if bench.get("status"):
        lines += [str(bench["status"]), ""]
    paths = bench.get("paths") or []
    if paths:
        lines += _table(
            ["path", "passages/s", "tokens/s", "p50 ms per call", "repeats", "warm-up s", "compile s"],
            [
                [
                    r.get("path", "-"),
                    _num(r.get("passages_per_s")),
                    _num(r.get("tokens_per_s"), ".0f"),
                    _num(r.get("p50_ms"), ".0f"),
                    r.get("repeats", "-"),
                    _num(r.get("warmup_s")),
                    _num(r.get("compile_s")),
                ]
                for r in paths
            ],
        )
    for pid, why in (bench.get("not_measured") or {}).items():
        lines.append(f"- not measured: {pid}: {why}")
    return lines


def _left_out(rows: list[dict]) -> list[str]:
    skipped = [r for r in rows if "skipped" in r and r.get("kind") != "export"]
    errors = [r for r in rows if "error" in r and r.get("kind") != "export"]
    lines = []
    if skipped:
        lines += ["", "## Not measured", ""] + [f"- {label(r)}: {r['skipped']}" for r in skipped]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {label(r)}: {_cell(r['error'])}" for r in errors]
    return lines


def markdown(report: dict) -> str:
    """gpu.md: the budget, the GPU check, the exports, ms per batch per path, every case,
    fidelity, the RAG workload, and what was not measured or failed, and why."""
    info = report.get("info") or {}
    rows = [r for r in report.get("rows") or [] if isinstance(r, dict)]
    lines = [
        f"# GPU benchmark ({info.get('gpu') or info.get('device', '-')}, {info.get('config', '-')})",
        "",
        f"Command: `{report.get('command', '-')}`",
        "",
        f"Budget: {_num(info.get('budget_s'), '.0f')} s, {_num(info.get('elapsed_s'), '.0f')} s used"
        + (f"; stopped: {info['stopped']}" if info.get("stopped") else "")
        + ".",
    ]
    if info.get("versions"):
        lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + "."]
    for part in (
        _gpu_check(rows),
        _exports(rows),
        _pivot(rows),
        _cases(rows, info.get("peak_tflops")),
        _checks(rows),
        _bench(report.get("bench")),
        _left_out(rows),
    ):
        lines += part
    return "\n".join(lines) + "\n"


def plot(report: dict, path) -> bool:
    """gpu.png: sequences/s against batch at the longest length measured, per model and
    path; False where matplotlib is missing or nothing was measured."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [
        r
        for r in _timed([r for r in report.get("rows") or [] if isinstance(r, dict)])
        if isinstance(r.get("sequences_per_s"), (int, float)) and isinstance(r.get("batch"), int)
    ]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for model, name in dict.fromkeys((str(r.get("model") or ""), path_of(r)) for r in rows):
        mine = [r for r in rows if str(r.get("model") or "") == model and path_of(r) == name]
        length = max(r.get("length") or 0 for r in mine)
        pts = sorted((r["batch"], r["sequences_per_s"]) for r in mine if (r.get("length") or 0) == length)
        ax.plot(*zip(*pts), marker="o", label=f"{model} {name} (length {length})".strip())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("sequences/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(path: Path, text: str) -> None:
    """`text` into `path` whole (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def versions() -> dict[str, str]:
    """The versions that matter to the figures."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "onnxruntime", "onnx", "numpy"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "-"
    return out
