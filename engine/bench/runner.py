"""`prune bench`'s runner: starts the selected paths (engine.bench.registry) from the session
they share, runs them interleaved over the repeats (every path once a round) so that drift
hits them alike, stops early when its budget is spent or SIGTERM comes (keeping every repeat
that ended), and lists a path that cannot start or fails as not measured, with the reason."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.bench.figures import report, stopped_report
from engine.bench.registry import select, registry
from engine.bench.runs import BenchStopped, PathResult, Stop, core_input_data, perf_analyzer, text_input_data
from engine.bench.session import BenchOptions, BenchPath, Runner, Session
from engine.datafiles import load_rag_data
from engine.measuring import workload_batches


def workload(session: Session) -> list:
    """The padded batches the engine sends for the workload (the base export's batching:
    fp32, else fp16), made once a session."""
    return session.once(
        "batches", lambda: workload_batches(session.pruner(session.options.base), session.queries)
    )


def _start(session: Session, p: BenchPath) -> Runner | None:
    """`p` started (None: it cannot run here, or failed to start: the reason is kept);
    BenchStopped passes through."""
    session.log(f"starting {p.id} ...")
    session.starting = p.name
    try:
        runner = p.start(session)
    except BenchStopped:
        raise
    except Exception as exc:
        return session.not_here(f"failed to start: {type(exc).__name__}: {str(exc)[:300]}")
    if runner is None and p.name not in session.reasons:
        return session.not_here("not measurable here (the log says why)")
    if runner is not None and session.options.device == "cuda":
        # a GPU path's first pass makes what later passes reuse (sessions per shape, CUDA
        # graphs, cuDNN's choices, compiled kernels): once over the workload, untimed
        session.stop.check()
        t0 = time.perf_counter()
        try:
            runner(PathResult(p.name))
        except BenchStopped:
            raise
        except Exception as exc:
            return session.not_here(f"failed in its warm-up pass: {type(exc).__name__}: {str(exc)[:300]}")
        session.warmups[p.name] = time.perf_counter() - t0
        session.log(f"{p.id}: warm-up pass {session.warmups[p.name]:.1f} s")
    return runner


def _repeat(
    session: Session,
    active: dict[str, Runner],
    name: str,
    results: dict[str, PathResult],
    rnd: int,
    repeats: int,
) -> None:
    """One timed repeat of path `name` (round `rnd`), its seconds kept as it ends. A path
    that fails leaves `active` (its reason kept); BenchStopped passes through."""
    session.stop.check()
    t0 = time.perf_counter()
    try:
        own = active[name](results[name])
    except BenchStopped:
        raise
    except Exception as exc:
        session.reasons[name] = f"failed in round {rnd}: {type(exc).__name__}: {str(exc)[:300]}"
        session.log(f"{name}: {session.reasons[name]}")
        del active[name]
        return
    seconds = time.perf_counter() - t0 if own is None else float(own)
    results[name].seconds.append(seconds)
    session.log(f"round {rnd}/{repeats} {name}: {seconds:.3f} s")


def start_order(session: Session, paths: list[BenchPath]) -> list[BenchPath]:
    """The order the paths start in: the registry's; under a budget, the engine's own
    (in-process) paths first, so that a peer's long start (a compile) cannot leave them out."""
    if session.options.budget_s is None:
        return paths
    return sorted(paths, key=lambda p: p.group != "in-process")


def measure(session: Session, paths: list[BenchPath], repeats: int) -> dict[str, PathResult]:
    """Start the paths (a path that cannot run here is logged and left out, with its
    reason in `session.reasons`), then run them interleaved over `repeats`, every path once
    a round; each measured path's result. Under a budget, a path's first repeat runs as
    soon as it has started. Stopped early (the budget, SIGTERM), it keeps every repeat
    that ended."""
    n_passages = sum(len(q.passages) for q in session.queries)
    tokens = sum(int(b.attention_mask.sum()) for b in workload(session))
    results: dict[str, PathResult] = {}
    first = 2 if session.options.budget_s is not None else 1
    try:
        with session.stop.measuring():
            active: dict[str, Runner] = {}
            for p in start_order(session, paths):
                session.stop.check()
                runner = _start(session, p)
                if runner is None:
                    continue
                active[p.name] = runner
                results[p.name] = PathResult(p.name, passages=n_passages, tokens=tokens)
                if p.name in session.warmups:
                    results[p.name].extra["warmup_s"] = session.warmups[p.name]
                if first == 2:
                    _repeat(session, active, p.name, results, 1, repeats)
            for rnd in range(first, repeats + 1):
                for name in list(active):
                    _repeat(session, active, name, results, rnd, repeats)
    except BenchStopped as exc:
        session.log(
            f"prune bench stopped: {exc}; keeping the {sum(bool(r.seconds) for r in results.values())} "
            "path(s) measured so far"
        )
    for p in paths:
        r = results.get(p.name)
        if (r is None or not r.seconds or not r.latencies) and p.name not in session.reasons:
            started = "started, no repeat ended" if r is not None else "not started"
            session.reasons[p.name] = f"{started}: prune bench stopped ({session.stop.reason})"
    return {name: r for name, r in results.items() if r.seconds and r.latencies}


def bench(
    o: BenchOptions, log=print, out_dir: Path | None = None, stop: Stop | None = None
) -> dict[str, Any]:
    """Measure the selected paths of the registry and return the report (`bench_report`
    writes it). With `server_url`/`api_url` and no `only`, only the deployment's paths
    run (the local model still gives the workload's token counts). `stop` (default: the
    options' budget): when it says so, the report holds what was measured by then."""
    only = o.only if o.only is not None or not (o.server_url or o.api_url) else "^deployment-"
    qs = load_rag_data(o.data, o.queries)
    session = Session(o, qs, log, stop=stop or Stop(o.budget_s))
    with session.stack:
        try:
            with session.stop.measuring():
                session.stop.check()
                base = session.pruner(o.base)
                paths = select(registry(o, base.family.name), only)
        except BenchStopped as exc:
            log(f"prune bench stopped before it measured anything: {exc}")
            return stopped_report(session, str(exc))
        results = measure(session, paths, o.repeats)
        pa = None
        if session.started("servers") and out_dir is not None and o.perf and session.stop.reason is None:
            log("perf_analyzer ...")
            server = session.servers()[0]
            core = session.pruner("int8" if "int8" in o.models else o.base)
            pa = {
                "bench": perf_analyzer(
                    server.grpc_url,
                    "bench",
                    core_input_data(core, qs),
                    o.concurrencies,
                    out_dir,
                    o.perf_analyzer,
                    o.perf_window_ms,
                ),
                "bench_text": perf_analyzer(
                    server.grpc_url,
                    "bench_text",
                    text_input_data(qs),
                    o.concurrencies,
                    out_dir,
                    o.perf_analyzer,
                    o.perf_window_ms,
                ),
            }
        return report(session, paths, results, only, pa, workload(session))
