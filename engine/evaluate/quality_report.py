"""`prune eval`'s report: markdown tables, the precision-recall chart, the files written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


from engine.evaluate.quality import GridResult


def table(rows: Sequence[GridResult]) -> str:
    """Grid results as a markdown table."""
    lines = [
        "| method | F1 | precision | recall | per-doc F1 | kept | best setting |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, d = r.best["micro"], r.best["per_document"]
        setting = ", ".join(f"{k} {v}" for k, v in r.setting.items()) or "-"
        lines.append(
            f"| {r.name} | {100 * m['f1']:.2f} | {100 * m['precision']:.2f} | {100 * m['recall']:.2f} | "
            f"{100 * d['f1']:.2f} | {100 * r.best['kept_share']:.0f}% | {setting} |"
        )
    return "\n".join(lines)


def rerank_table(rows: dict[str, dict[str, float]]) -> str:
    """Reranking metrics as a markdown table."""
    lines = ["| method | MRR@10 | hit@1 | queries |", "|---|---|---|---|"]
    for name, m in rows.items():
        lines.append(f"| {name} | {m['mrr@10']:.4f} | {m['hit@1']:.4f} | {m['queries']} |")
    return "\n".join(lines)


def plot_pr(rows: Sequence[GridResult], path: str | Path) -> Path | None:
    """Precision/recall curves over the threshold grid (no backoff) as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, r in enumerate(rows):
        color = colors[k % len(colors)]
        pts = [c for c in r.curve if c["recall"] > 0]
        if pts:
            ax.plot(
                [c["recall"] for c in pts],
                [c["precision"] for c in pts],
                color=color,
                label=f"{r.name} (alpha {r.setting.get('alpha')})",
            )
        m = r.best["micro"]
        ax.scatter(
            [m["recall"]],
            [m["precision"]],
            color=color,
            marker="x" if pts else "o",
            label=None if pts else r.name,
            zorder=3,
        )
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Sentence-level precision / recall over the threshold grid\n(x: best F1 setting)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def domain_table(by_domain: dict[str, Any]) -> str:
    """F1 per domain against BM25's, as a markdown table."""
    names = list(by_domain["worst"])
    heads = " | ".join(f"{n} at its defaults (vs BM25)" for n in names)
    lines = [f"| domain | documents | BM25 best F1 | {heads} |", "|---|---|---|" + "---|" * len(names)]
    for d, row in by_domain["domains"].items():
        cells = [
            f"{100 * row['models'][n]['f1']:.2f} ({100 * row['models'][n]['over_bm25']:+.2f})" for n in names
        ]
        lines.append(
            f"| {d} | {row['documents']} | {100 * row['bm25_best_f1']:.2f} | " + " | ".join(cells) + " |"
        )
    worst = [
        f"{by_domain['worst'][n]['domain']} ({100 * by_domain['worst'][n]['over_bm25']:+.2f})" for n in names
    ]
    lines.append("| worst domain | | | " + " | ".join(worst) + " |")
    return "\n".join(lines)


def rag_table(metrics: dict[str, dict[str, float]]) -> str:
    """RAG metrics as a markdown table."""
    lines = [
        "| method | non-gold passages emptied | their characters kept | gold passages with something kept | "
        "their characters kept | MRR@10 | hit@1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in metrics.items():
        lines.append(
            f"| {name} | {100 * m['non_gold_emptied']:.1f}% | {100 * m['non_gold_chars_kept']:.1f}% | "
            f"{100 * m['gold_with_something_kept']:.1f}% | {100 * m['gold_chars_kept']:.1f}% | "
            f"{m['mrr@10']:.4f} | {m['hit@1']:.4f} |"
        )
    return "\n".join(lines)


def rag_domain_table(by_domain: dict[str, dict[str, Any]]) -> str:
    """Per model and domain: the answer passages lost at the defaults (the calls: eval.json)."""
    lines = [
        "| model | domain | calls | gold passages with something kept | lost | non-gold emptied | MRR@10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, domains in by_domain.items():
        for d, m in domains.items():
            lines.append(
                f"| {name} | {d} | {m['queries']} | {100 * m['gold_with_something_kept']:.1f}% | "
                f"{m['gold_lost']} of {m['gold_passages']} | {100 * m['non_gold_emptied']:.1f}% | "
                f"{m['mrr@10']:.4f} |"
            )
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: str | Path, title: str, command: str) -> dict[str, Path]:
    """The report as JSON and markdown in `out_dir`; the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = report.pop("_rows", None)
    paths = {"json": out_dir / "eval.json", "markdown": out_dir / "eval.md"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    md = [f"# {title}", "", "Command:", "", "```", command, "```", ""]
    if report.get("windows"):
        md += ["Windows: " + ", ".join(f"{n}: {w}" for n, w in report["windows"].items()), ""]
    if report.get("pruning"):
        pr = report["pruning"]
        md += [
            f"## Sentence-level pruning: {pr['data']}",
            "",
            f"{pr['documents']} documents, {pr['sentences']} sentences, "
            f"{100 * pr['positive_share']:.1f}% labelled keep. Best micro F1 over the grid "
            "(threshold 0-1 step 0.01, backoff alpha in {none, 0, .01, .02, .05, .1, .2, .3, .5}).",
            "",
            table(rows) if rows else "",
            "",
        ]
        if rows and plot_pr(rows, out_dir / "pr_curve.png"):
            paths["plot"] = out_dir / "pr_curve.png"
            md += ["![precision-recall](pr_curve.png)", ""]
        if pr.get("by_domain"):
            md += [
                "### By domain",
                "",
                "F1 at each model's defaults against BM25 at its best threshold on the "
                "domain's documents (IDF over them).",
                "",
                domain_table(pr["by_domain"]),
                "",
            ]
    if report.get("rag"):
        rg = report["rag"]
        md += [
            f"## RAG calls: {rg['data']}",
            "",
            f"{rg['queries']} calls, {rg['passages']} passages; each model at "
            "its defaults, one call per question with all its passages.",
            "",
            rag_table(rg["metrics"]),
            "",
        ]
        if rg.get("by_domain"):
            md += [
                "Answer passages lost, per domain (each lost one with its call: `rag.by_domain` in eval.json):",
                "",
                rag_domain_table(rg["by_domain"]),
                "",
            ]
    if report.get("reranking"):
        md += [
            f"## Reranking: {report['reranking']['data']}",
            "",
            rerank_table(report["reranking"]["metrics"]),
            "",
        ]
    paths["markdown"].write_text("\n".join(md))
    return paths
