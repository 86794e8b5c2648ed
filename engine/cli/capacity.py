"""`prune capacity`: replicas for a request rate and a p99 budget, from a `prune bench` run."""

from __future__ import annotations

import json
from pathlib import Path

from engine.errors import InputError


def add(new) -> None:
    """`prune capacity`'s flags."""
    c = new(
        "capacity",
        help="how many replicas a request rate and a p99 budget need, from a prune bench run "
        "(docs/scaling.md)",
    )
    c.add_argument("--bench", required=True, help="a bench.json written by prune bench --triton")
    c.add_argument(
        "--path",
        default="triton-text-grpc",
        help="the path family, without ' cN (...)' (default: triton-text-grpc)",
    )
    c.add_argument("--rates", type=float, nargs="+", default=[1, 2, 5, 10, 20], help="queries/s to size for")
    c.add_argument("--p99", type=float, default=1.5, help="the p99 latency budget in seconds (default 1.5)")
    c.set_defaults(func=run)


def run(args) -> int:
    """Run `prune capacity`; the exit status."""
    from engine.bench.sizing import report_lines

    try:
        report = json.loads(Path(args.bench).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"--bench {args.bench}: not a readable bench.json ({exc})") from None
    if any(r <= 0 for r in args.rates) or args.p99 <= 0:
        raise InputError("--rates and --p99 must be positive")
    print("\n".join(report_lines(report, args.bench, args.path, args.rates, args.p99)))
    return 0
