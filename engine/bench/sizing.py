"""How many replicas a request rate and a p99 budget need, from a measured `prune bench`
run (`prune capacity`; docs/scaling.md).

The model (docs/scaling.md): a replica is one queue (M/G/1) served at its measured
saturation throughput mu (queries/s: the best of the path's concurrencies), so a query's
mean service time is S = 1/mu; its variability Cs^2 comes from the path's measured
concurrency-1 latencies ((p99 - p50) / 2.33 as the standard deviation). Requests arrive at
random (Poisson) and are spread evenly over N replicas, each at utilization rho = lambda / (N mu).
The mean wait is Pollaczek-Khinchine's W = rho S (1 + Cs^2) / (2 (1 - rho)), and the wait
is taken as exponential beyond it: P(wait > t) = rho exp(-t rho / W) (exact for M/M/1), so
the p99 wait is (W / rho) ln(100 rho). N is the smallest count whose concurrency-1 p99 plus
p99 wait fits the budget, plus one so that losing a replica keeps the budget. The
autoscaling threshold is the mean queue wait W at the highest utilization that fits.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import InputError


def path_figures(report: dict, prefix: str) -> dict[str, float]:
    """mu (queries/s at saturation), the concurrency-1 p50/p99 (s) and Cs^2 of a bench path family."""
    queries = report["settings"]["queries"]
    rows = [r for r in report["paths"] if r["path"].startswith(prefix + " c")]
    if not rows:
        names = sorted({r["path"] for r in report["paths"]})
        raise InputError(f"no path starting with {prefix!r} c in the report; paths: {names}")
    c1 = next((r for r in rows if r["path"] == prefix + " c1" or r["path"].startswith(prefix + " c1 ")), None)
    if c1 is None:
        raise InputError(
            f"the report has no {prefix!r} c1 path: the concurrency-1 latency is the model's input"
        )
    mu = max(queries / r["seconds_median"] for r in rows)
    s50, s99 = c1["p50_ms"] / 1000, c1["p99_ms"] / 1000
    cs2 = ((s99 - s50) / 2.33 * mu) ** 2
    return {"mu": mu, "s50": s50, "s99": s99, "cs2": cs2, "paths": [r["path"] for r in rows]}


def mean_wait(rho: float, mu: float, cs2: float) -> float:
    """Pollaczek-Khinchine: the mean time a request waits in an M/G/1 queue."""
    return rho * (1 + cs2) / (2 * mu * (1 - rho)) if rho < 1 else math.inf


def p99_wait(rho: float, mu: float, cs2: float) -> float:
    """The 99th percentile of the wait: exponential beyond the mean (exact for M/M/1)."""
    if rho >= 1:
        return math.inf
    if rho <= 0.01:
        return 0.0
    return mean_wait(rho, mu, cs2) / rho * math.log(100 * rho)


def replicas_needed(rate: float, f: dict[str, float], budget: float) -> tuple[int, float]:
    """(replicas with one spare, p99 latency at that count without the spare)."""
    if f["s99"] >= budget:
        return -1, f["s99"]
    n = max(1, math.ceil(rate / f["mu"]))
    while f["s99"] + p99_wait(rate / (n * f["mu"]), f["mu"], f["cs2"]) > budget:
        n += 1
    return n + 1, f["s99"] + p99_wait(rate / (n * f["mu"]), f["mu"], f["cs2"])


def max_utilization(f: dict[str, float], budget: float) -> float:
    """The largest rho with s99 + p99 wait <= budget (bisection)."""
    lo, hi = 0.0, 0.999
    for _ in range(60):
        mid = (lo + hi) / 2
        if f["s99"] + p99_wait(mid, f["mu"], f["cs2"]) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def report_lines(
    report: dict[str, Any], source: str, path: str, rates: list[float], budget: float
) -> list[str]:
    """What `prune capacity` prints for a bench report: the per-replica figures, the
    utilization and autoscaling threshold for the budget, and a table of replicas per rate."""
    f = path_figures(report, path)
    rho = max_utilization(f, budget)
    machine = report["machine"]
    per_query = report["settings"]["passages"] / report["settings"]["queries"]
    lines = [
        f"bench {source} ({report['date']}; {machine.get('cpu_model', '')}, {machine.get('cpus', '')} CPUs), "
        f"paths {', '.join(f['paths'])}",
        f"per replica: saturation {f['mu']:.2f} queries/s ({per_query:.0f} passages each), concurrency-1 "
        f"latency p50 {f['s50'] * 1000:.0f} ms, p99 {f['s99'] * 1000:.0f} ms, service-time Cs^2 {f['cs2']:.2f}",
        f"p99 budget {budget:g} s: at most {rho:.0%} utilization per replica; autoscaling threshold (mean queue "
        f"wait there): {mean_wait(rho, f['mu'], f['cs2']) * 1000:.0f} ms",
        "",
        "| queries/s | replicas (one spare) | p99 at that count without the spare |",
        "|---|---|---|",
    ]
    for rate in rates:
        n, p99 = replicas_needed(rate, f, budget)
        lines.append(f"| {rate:g} | {n if n > 0 else 'budget below one query'} | {p99 * 1000:.0f} ms |")
    return lines
