"""How many worker threads the HTTP API should run its one shared pruner in.

    python -m benchmarks.api_workers --data tests/data/squad-dev-rag.jsonl --out benchmarks/results/api-workers

For each pool size, `prune api`'s app (the default model, in-process) on a loopback port,
and 1 and 16 concurrent clients each sending TEI `/rerank` calls of one question with its
passages (the RAG workload); pool sizes interleaved over the repeats, medians reported.
"""
from __future__ import annotations

import socket
import statistics
from concurrent.futures import ThreadPoolExecutor

from engine.tools.harness import Study, interleave, parser


def main(argv=None) -> int:
    ap = parser(__doc__, repeats=3)
    ap.add_argument("--data", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--passages", type=int, default=10, help="passages per call")
    ap.add_argument("--calls", type=int, default=48, help="calls per measurement")
    args = ap.parse_args(argv)
    import time

    import httpx

    from engine.http.app import ApiConfig, create_app
    from engine.http.server import ApiThread
    from engine.pruner import Pruner
    from engine.tools.quality import load_rag_data
    study = Study("api-workers", "benchmarks.api_workers", argv)
    rows = [(q.question, q.passages[:args.passages]) for q in load_rag_data(args.data)]
    pruner = Pruner.load(args.model, threads=args.threads)
    sizes = [int(w) for w in args.workers.split(",")]
    servers = {}
    for w in sizes:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        servers[w] = ApiThread(create_app(pruner, ApiConfig(workers=w)), port=port).start()
    p50: dict[str, list[float]] = {}

    def measure(key: str, url: str, concurrency: int):
        def go() -> float:
            def call(k: int) -> float:
                q, texts = rows[k % len(rows)]
                t0 = time.perf_counter()
                r = client.post(f"{url}/rerank", json={"query": q, "texts": texts}, timeout=120)
                r.raise_for_status()
                return time.perf_counter() - t0
            with httpx.Client() as client, ThreadPoolExecutor(concurrency) as pool:
                t0 = time.perf_counter()
                latencies = list(pool.map(call, range(args.calls)))
                wall = time.perf_counter() - t0
            p50.setdefault(key, []).append(statistics.median(latencies) * 1000)
            return wall
        return go
    variants = {f"workers {w} c{c}": measure(f"workers {w} c{c}", servers[w].url, c) for c in (1, 16) for w in sizes}
    try:
        times = interleave(variants, args.repeats)
    finally:
        for server in servers.values():
            server.stop()
    rate = {k: args.calls * args.passages / statistics.median(t) for k, t in times.items()}
    table = ["| workers | c1 passages/s | c1 p50 ms | c16 passages/s | c16 p50 ms |", "|---|---|---|---|---|"]
    for w in sizes:
        c1, c16 = f"workers {w} c1", f"workers {w} c16"
        table.append(f"| {w} | {rate[c1]:.1f} | {statistics.median(p50[c1]):.0f} | {rate[c16]:.1f} "
                     f"| {statistics.median(p50[c16]):.0f} |")
    lines = study.header("HTTP API: worker threads for one shared pruner",
                         f"Model {args.model}, {args.passages} passages a call, {args.calls} calls a measurement, "
                         f"medians of {args.repeats} interleaved rounds.") + table
    study.write(args.out, {"seconds": times, "p50_ms": p50, "passages_per_s": rate}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
