"""How the engine times models against each other: `prune export --precision auto` picks
its precision with these, and `prune bench` and every study under benchmarks/ time with
them (engine.bench.harness adds a study's report around them).

- `interleave`: rounds in which every variant runs once, so that drift (turbo, a
  neighbour's load) hits them alike; each variant's seconds per round, and `medians`;
- `model_passes`: (with engine.measuring.workload_batches, the padded batches a pruner sends for some calls)
  and each pruner's model alone over them;
- `cpu_model`: the CPU's name, for the report beside the figures.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

Log = Callable[[str], None]


def stderr(message: str) -> None:
    """A progress line (stderr: stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


def interleave(
    variants: dict[str, Callable[[], float | None]], repeats: int, log: Log = stderr, warmup: bool = False
) -> dict[str, list[float]]:
    """Run every variant once per round, `repeats` rounds; each variant's seconds per round.

    A variant returns its own seconds (when it times only part of its work) or None (the
    harness times the whole call). `warmup`: one untimed round first."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rnd in range(-1 if warmup else 0, repeats):
        order = list(variants.items())
        for name, run in order:
            t0 = time.perf_counter()
            own = run()
            seconds = time.perf_counter() - t0 if own is None else float(own)
            if rnd < 0:
                continue
            times[name].append(seconds)
            log(f"round {rnd + 1}/{repeats} {name}: {seconds:.3f} s")
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's median."""
    return {name: statistics.median(t) for name, t in times.items()}


def model_passes(pruners: dict[str, Any], batches: list) -> dict[str, Callable[[], None]]:
    """For `interleave`: each pruner's model alone over the same padded batches, one pass."""

    def one_pass(pruner) -> Callable[[], None]:
        def run() -> None:
            for b in batches:
                pruner.backend.infer(b)

        return run

    return {name: one_pass(p) for name, p in pruners.items()}


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo's), None where it does not say."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
