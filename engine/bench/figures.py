"""The figures of `prune bench`'s report (engine.bench.registry measures the paths,
engine.bench.report writes the figures as markdown and a chart): each path's
medians and latencies against the reference, the machine and the workload's settings,
the batching ablation's padding, the client's share, bytes per passage, perf_analyzer's
figures, and each in-process path's share of this machine's GEMM rate
(engine.bench.limits).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from engine.pipeline.spec import Manifest
from engine.measuring import workload_batches
from engine.bench.session import BenchPath, Session
from engine.machine.describe import machine_info
from engine.bench.runs import PathResult, client_share, output_bytes, padding_share
from engine.bench.peers import call_texts


def fixed_batches(pruner, queries) -> list:
    """The batches of the ablation (fixed batches of 8 in input order) for `pruner`'s
    model, made without loading it again (only its batching differs; whatever batching
    the pruner's core runs, as the GPU's fixed shapes do)."""
    import copy

    from engine.pipeline.encode import BatchingConfig

    fixed = copy.copy(pruner)
    fixed.batching = BatchingConfig(strategy="fixed", max_batch_size=8)
    return workload_batches(fixed, queries)


def _settings(o, qs: list, tokens: int | None) -> dict[str, Any]:
    """The report's settings: the workload and the options."""
    return {
        "data": str(o.data),
        "queries": len(qs),
        "passages": sum(len(q.passages) for q in qs),
        "tokens": tokens,
        "device": o.device,
        "repeats": o.repeats,
        "threads": o.threads,
        "models": {k: str(v) for k, v in o.models.items()},
        "checkpoint": o.checkpoint,
        "only": o.only,
        "text_instances": o.text_instances,
        "replicas": o.replicas,
        "server": o.server_url,
        "text_model": o.text_model if o.server_url else None,
        "api": o.api_url,
        "budget_s": o.budget_s,
        "compile_backend": o.compile_backend,
    }


def not_measured(session: Session, paths: list[BenchPath], results: dict[str, PathResult]) -> dict[str, str]:
    """Each selected path that has no figures, by id, with the reason."""
    return {p.id: session.reasons.get(p.name, "not measured") for p in paths if p.name not in results}


def stopped_report(session: Session, reason: str) -> dict[str, Any]:
    """The report of a run stopped before it measured anything (before its first path
    started): the machine, the settings, and why."""
    return {
        "machine": machine_info(session.options.device),
        "settings": _settings(session.options, session.queries, None),
        "paths": [],
        "not_measured": [],
        "not_measured_reasons": {},
        "stopped": reason,
        "elapsed_s": session.stop.elapsed(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def report(
    session: Session,
    paths: list[BenchPath],
    results: dict[str, PathResult],
    only: str | None,
    pa: dict[str, Any] | None,
    sorted_batches: list,
) -> dict[str, Any]:
    """The report of a measured run (see the module docstring); `sorted_batches`: the
    workload's padded batches (engine.bench.runner.workload). A run stopped early reports
    the paths it measured, says which it did not and why, and skips the GEMM limit."""
    o, qs, log = session.options, session.queries, session.log
    base_pruner = session.pruner(o.base)
    fixed = fixed_batches(base_pruner, qs)
    n_passages = sum(len(q.passages) for q in qs)
    on = "" if o.device == "cpu" else "-cuda"
    base_name = "torch-unbatched (reference)" if o.checkpoint else f"onnxruntime{on}-{o.base}"
    base = statistics.median(results[base_name].seconds) if base_name in results else None
    batched_t = statistics.median(results["torch-batched"].seconds) if "torch-batched" in results else None
    rows = [results[p.name].summary(base) | {"group": p.group} for p in paths if p.name in results]
    for row in rows:
        row["speedup_vs_torch_batched"] = (batched_t / row["seconds_median"]) if batched_t else None
    missing = not_measured(session, paths, results)
    rep: dict[str, Any] = {
        "machine": machine_info(o.device),
        "settings": {
            **_settings(o, qs, sum(int(b.attention_mask.sum()) for b in sorted_batches)),
            "only": only,
            "buckets": list(base_pruner.batching.buckets_for(base_pruner.spec.max_length)),
            "max_batch_tokens": base_pruner.batching.max_batch_tokens,
        },
        "paths": rows,
        "not_measured": list(missing),
        "not_measured_reasons": missing,
        "stopped": session.stop.reason,
        "elapsed_s": session.stop.elapsed(),
        "client": client_share(base_pruner, qs),
        "padding_share": {
            "sorted token budget": padding_share(sorted_batches),
            "fixed batches of 8, input order": padding_share(fixed),
        },
        "output_size": output_bytes(sorted_batches, n_passages),
        "perf_analyzer": pa,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if o.device == "cpu" and session.stop.reason is None:
        graphs, sent = graph_shapes(session, paths, results, sorted_batches, fixed)
        rep["limits"] = (
            machine_limits(rows, graphs, o.threads, sent, log)
            if sent
            else {"skipped": "no measured path ran an fp32 or int8 graph"}
        )
    elif o.device == "cpu":
        rep["limits"] = {"skipped": f"prune bench stopped early ({session.stop.reason})"}
    model_int8 = next((r for r in rows if r["path"] == "onnxruntime-int8"), None)
    if model_int8:
        rep["client"]["share_of_int8_total"] = rep["client"]["client_seconds"] / model_int8["seconds_median"]
    return rep


def graph_shapes(
    session: Session,
    paths: list[BenchPath],
    results: dict[str, PathResult],
    sorted_batches: list,
    fixed: list,
) -> tuple[dict[str, Path], dict[str, tuple[str, str, list]]]:
    """For machine_limits: the graphs (an exported folder or an ONNX file, by name) and
    what each measured path sent: path -> (graph, precision, padded (rows, length) batches)."""
    o, qs = session.options, session.queries
    shapes = {
        "sorted": [b.input_ids.shape for b in sorted_batches],
        "fixed": [b.input_ids.shape for b in fixed],
    }
    peers = session.peers() if session.started("peers") else {}
    graphs: dict[str, Path] = {k: v for k, v in o.models.items() if k in ("fp32", "int8")}
    sent: dict[str, tuple[str, str, list]] = {}
    for p in paths:
        if p.name not in results or p.graph is None:
            continue
        if p.batches == "peer":
            peer = peers.get(p.graph)
            if peer is None or peer.graph is None:
                continue
            graphs[p.graph] = peer.graph
            sent[p.name] = (
                p.graph,
                peer.precision,
                [sh for q in qs for sh in peer.shapes(call_texts(q.question, q.passages)[0])],
            )
        elif p.graph in graphs:
            sent[p.name] = (p.graph, p.precision, shapes[p.batches])
    return graphs, sent


def machine_limits(
    rows: list[dict[str, Any]],
    graphs: dict[str, Path],
    threads: int | None,
    sent: dict[str, tuple[str, str, list]],
    log=print,
) -> dict[str, Any]:
    """This CPU's fp32 and int8 GEMM rates with ONNX Runtime (and, where an OpenVINO path
    ran, OpenVINO's f32, bf16 and int8 ones), each graph's work per token
    (engine.bench.limits), and every in-process path's achieved rate as a share of the
    machine's rate for its arithmetic (the fastest any runtime reached; `limit_share` in
    its row). `graphs`: an exported model folder (its manifest names the graph) or an ONNX
    file, by name; `sent`: path -> (the graph's name, precision: fp32, bf16 or int8, the
    padded (rows, length) batches the path sent)."""
    try:
        from engine.bench.limits import gemm_rates, graph_work, openvino_gemm_rates, workload_flops

        rates = gemm_rates(threads)
    except ImportError as exc:  # onnx (the [export] extra) builds the GEMM graphs
        return {"skipped": f"needs {exc.name} (pip install 'prune-engine[export]')"}
    keys = {"fp32": "fp32_gflops", "bf16": "bf16_gflops", "int8": "int8_gops"}
    limits = {kind: (rates[key], "onnxruntime") for kind, key in keys.items() if key in rates}
    if any(path.startswith("openvino") for path in sent):
        rates["openvino"] = openvino_gemm_rates(threads)
        for kind, key in keys.items():
            if key in rates["openvino"] and rates["openvino"][key] > limits.get(kind, (0.0, ""))[0]:
                limits[kind] = (rates["openvino"][key], "openvino")
    log(
        "GEMM limit: "
        + ", ".join(f"{kind} {rate:.0f} G/s ({runtime})" for kind, (rate, runtime) in limits.items())
    )
    rates["limits"] = {kind: {"rate": rate, "runtime": runtime} for kind, (rate, runtime) in limits.items()}
    out: dict[str, Any] = {"gemm": rates, "work": {}}
    for name, where in graphs.items():
        where = Path(where)
        if where.is_dir():
            manifest = Manifest.read(where)
            work = graph_work(where / manifest.graph)
            work["hidden_size"] = int(manifest.source.hidden_size)
        else:  # a plain export: config.json beside it
            work = graph_work(where)
            work["hidden_size"] = int(json.loads((where.parent / "config.json").read_text())["hidden_size"])
        out["work"][name] = work
    for row in rows:
        if row["path"] not in sent or sent[row["path"]][0] not in out["work"]:
            continue
        graph, precision, shapes = sent[row["path"]]
        work = out["work"][graph]
        flops = workload_flops(shapes, work, work["hidden_size"])
        rate = flops / row["seconds_median"] / 1e9
        if precision not in limits:
            continue
        limit, runtime = limits[precision]
        row.update(
            achieved_gflops=rate,
            limit_share=rate / limit,
            limit=f"{precision} GEMM {limit:.0f} G/s ({runtime})",
        )
    return out
