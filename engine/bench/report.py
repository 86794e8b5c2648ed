"""`prune bench`'s report: markdown with the command that made it, and a chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _header(report: dict[str, Any], command: str) -> list[str]:
    """The title, the command, the machine and the workload (whatever of them the report has)."""
    m, s = report.get("machine") or {}, report.get("settings") or {}
    tokens = s.get("tokens")
    return [
        f"# Benchmark {report.get('date', '')}",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Machine: {m.get('cpu_model', m.get('processor', '-'))}, {m.get('cpus', '-')} CPUs"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + f"; Python {m.get('python', '-')}, "
        f"onnxruntime {m.get('onnxruntime', '-')}, torch {m.get('torch', '-')}.",
        f"Workload: {s.get('queries', '-')} queries, {s.get('passages', '-')} passages, "
        + (f"{tokens} tokens (with special tokens, unpadded)" if tokens is not None else "tokens not counted")
        + f" of {s.get('data', '-')}; {s.get('repeats', '-')} repeats, medians; threads {s.get('threads')}.",
        "",
    ]


def _stopped(report: dict[str, Any]) -> list[str]:
    """What a run stopped early did and did not measure, and why."""
    lines = []
    if report.get("stopped"):
        done = ", ".join(f"{r['path']} {r.get('repeats', '?')}" for r in report.get("paths", [])) or "none"
        lines += [
            f"**Stopped early**: {report['stopped']} (after {report.get('elapsed_s', 0):.0f} s); the rows hold "
            f"the repeats that ended (repeats per path: {done}).",
            "",
        ]
    reasons = report.get("not_measured_reasons") or {
        i: "not measured" for i in report.get("not_measured", [])
    }
    if reasons:
        lines += ["Not measured:", ""] + [f"- {pid}: {why}" for pid, why in reasons.items()] + [""]
    return lines


def _first_passes(rows: list[dict[str, Any]]) -> list[str]:
    """The untimed first passes: a GPU path's warm-up, torch.compile's compile."""
    lines: list[str] = []
    warmed = [r for r in rows if r.get("warmup_s") is not None]
    if warmed:
        lines += [
            "",
            "Warm-up (one untimed pass over the workload before the repeats, on a GPU): "
            + "; ".join(f"{r['path']} {r['warmup_s']:.1f} s" for r in warmed)
            + ".",
        ]
    compiled = [r for r in rows if "compile_s" in r]
    if compiled:
        lines += [
            "",
            "torch.compile: "
            + "; ".join(
                f"{r['path']}: {r['compile_s']:.1f} s for its first pass over the "
                "workload, compiling (not in the timed repeats)"
                for r in compiled
            )
            + ".",
        ]
    return lines


def markdown(report: dict[str, Any], command: str) -> str:
    """The benchmark's report as markdown, with the command that made it; a run stopped
    early says so, and which paths it did not measure, and why."""
    lines = _header(report, command) + _stopped(report)
    if not report.get("paths"):
        return "\n".join(lines + ["No path was measured."]) + "\n"
    lines += [
        "| path | passages/s | tokens/s | p50 ms | p95 ms | p99 ms | vs reference | vs torch batched |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["paths"]:
        vs = f"{r['speedup_vs_reference']:.2f}x" if r.get("speedup_vs_reference") else "-"
        vb = f"{r['speedup_vs_torch_batched']:.2f}x" if r.get("speedup_vs_torch_batched") else "-"
        lines.append(
            f"| {r['path']} | {r['passages_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['p50_ms']:.0f} | "
            f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {vs} | {vb} |"
        )
    lines += _first_passes(report["paths"])
    lines += _limits(report) + _served(report)
    if report.get("client") is None:
        return "\n".join(lines) + "\n"
    return "\n".join(lines + _client(report) + _perf_analyzer(report)) + "\n"


def _limits(report: dict[str, Any]) -> list[str]:
    """This machine's GEMM limit and each path's share of it."""
    lines: list[str] = []
    limits = report.get("limits") or {}
    if "gemm" in limits:
        g = limits["gemm"]
        ov = g.get("openvino")
        lines += [
            "",
            f"This machine's limit ({g['shape'][0]}x{g['shape'][1]} by {g['shape'][1]}x"
            f"{g['shape'][2]}, threads {g['threads']}): ONNX Runtime fp32 MatMul {g['fp32_gflops']:.0f} "
            f"GFLOP/s, int8 MatMulInteger {g['int8_gops']:.0f} GOP/s"
            + (
                "; OpenVINO " + ", ".join(f"{k.split('_')[0]} {v:.0f}" for k, v in ov.items()) + " G/s"
                if ov
                else ""
            )
            + ("; a path's limit is the fastest rate of its arithmetic on any runtime" if ov else "")
            + ". Work per token from the graph: "
            + ", ".join(
                f"{k} {w['linear_flops_per_token'] / 1e6:.1f} MFLOP in weight products and "
                f"{w['activation_products']:.0f} activation products of 2 x L x {w['hidden_size']}"
                for k, w in limits["work"].items()
            )
            + " (L the padded length sent).",
            "",
            "| path | achieved G(FL)OP/s | share of the limit |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['path']} | {r['achieved_gflops']:.0f} | {100 * r['limit_share']:.0f}% of the {r['limit']} |"
            for r in report["paths"]
            if "limit_share" in r
        ]
    elif limits:
        lines += ["", f"Machine limit: {limits['skipped']}."]
    return lines


def _served(report: dict[str, Any]) -> list[str]:
    """The core model under the text model, and the HTTP API against the text model."""
    lines: list[str] = []
    core = [r for r in report["paths"] if "core_requests" in r]
    if core:
        lines += [
            "",
            "Core model under the text model (last repeat): "
            + "; ".join(
                f"{r['path']}: {r['core_requests']} BLS requests in {r['core_executions']} executions"
                for r in core
            )
            + ".",
        ]
    by_path = {r["path"]: r for r in report["paths"]}
    api_vs = []
    for conc in (1, 4, 16):
        api = next((r for n, r in by_path.items() if n.startswith(f"api-text-grpc c{conc} ")), None)
        grpc = next((r for n, r in by_path.items() if n.startswith(f"triton-text-grpc c{conc} ")), None)
        if api and grpc:
            api_vs.append(
                f"c{conc}: {100 * api['passages_per_s'] / grpc['passages_per_s']:.0f}% of its throughput, "
                f"p50 {api['p50_ms'] - grpc['p50_ms']:+.1f} ms"
            )
    if api_vs:
        lines += [
            "",
            "The HTTP API in front of the text model, against the text model over gRPC: "
            + "; ".join(api_vs)
            + ".",
        ]
    return lines


def _client(report: dict[str, Any]) -> list[str]:
    """The client's own work, the padding, the bytes returned per passage."""
    c = report["client"]
    lines: list[str] = []
    lines += [
        "",
        "Client-side work (split, tokenize, encode, batch, decide): "
        f"{c['client_passages_per_s_one_core']:.0f} "
        f"passages/s on one core"
        + (
            f"; {100 * c['share_of_int8_total']:.1f}% of the INT8 path's total time."
            if "share_of_int8_total" in c
            else "."
        ),
        "",
        "Padding share of the tokens sent to the model: "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in report["padding_share"].items())
        + ".",
        "",
        "Bytes returned per passage: in-graph sentence pooling {:.0f}, raw token outputs {:.0f} "
        "({:.0f}x less).".format(
            report["output_size"]["pooled_bytes_per_passage"],
            report["output_size"]["raw_token_bytes_per_passage"],
            report["output_size"]["reduction"],
        ),
    ]
    return lines


def _perf_analyzer(report: dict[str, Any]) -> list[str]:
    """perf_analyzer's tables."""
    lines: list[str] = []
    what = {
        "bench": "the core model, one real block of the workload per request",
        "bench_text": "the text model, one real query (question and its passages, BYTES) per request",
    }
    for model, pa in (report.get("perf_analyzer") or {}).items():
        if pa and "skipped" not in pa:
            lines += [
                "",
                f"perf_analyzer (Triton's load generator, gRPC) on {what.get(model, model)}:",
                "",
                "| concurrency | inferences/s | p50 us | p95 us | p99 us | server queue us | "
                "server compute infer us |",
                "|---|---|---|---|---|---|---|",
            ]
            for conc, r in pa.items():
                lines.append(
                    f"| {conc} | {r.get('Inferences/Second', 0):.1f} | {r.get('p50 latency', 0):.0f} | "
                    f"{r.get('p95 latency', 0):.0f} | {r.get('p99 latency', 0):.0f} | "
                    f"{r.get('Server Queue', 0):.0f} | {r.get('Server Compute Infer', 0):.0f} |"
                )
        elif pa:
            lines += ["", f"perf_analyzer ({model}): {pa['skipped']}"]
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    """A bar chart of passages/s per path, written to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["paths"]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    names = [r["path"] for r in rows]
    axes[0].barh(names, [r["passages_per_s"] for r in rows], color="tab:blue")
    axes[0].set_xlabel("passages / s (higher is better)")
    axes[0].invert_yaxis()
    y = np.arange(len(rows))
    for k, (key, color) in enumerate(
        [("p50_ms", "tab:green"), ("p95_ms", "tab:orange"), ("p99_ms", "tab:red")]
    ):
        axes[1].barh(y + (k - 1) * 0.27, [r[key] for r in rows], height=0.27, color=color, label=key[:3])
    axes[1].set_yticks(y, names)
    axes[1].invert_yaxis()
    axes[1].set_xlabel("latency per query, ms (lower is better)")
    axes[1].legend()
    fig.suptitle(
        f"prune-engine, {report['settings']['queries']} RAG queries, "
        f"{report['machine'].get('cpu_model', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
