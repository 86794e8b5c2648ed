"""How many worker threads the HTTP API should run its one shared pruner in.

    python -m benchmarks.api_workers --data tests/data/squad-dev-rag.jsonl --out benchmarks/results/api-workers

For each pool size, `prune api`'s app (the default model, in-process) on a loopback port,
and 1 and 16 concurrent clients each sending TEI `/rerank` calls of one question with its
passages (the RAG workload); pool sizes interleaved over the repeats, medians reported.
"""
from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="RAG JSONL (question, passages)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--passages", type=int, default=10, help="passages per call")
    ap.add_argument("--calls", type=int, default=48, help="calls per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import httpx
    import uvicorn
    from engine.http.app import ApiConfig, create_app
    from engine.pruner import Pruner
    from engine.tools.quality import load_rag_data
    from tests.conftest import free_ports

    rows = [(q.question, q.passages[:args.passages]) for q in load_rag_data(args.data)]
    pruner = Pruner.load(args.model)
    sizes = [int(w) for w in args.workers.split(",")]
    servers = {}
    for w in sizes:
        (port,) = free_ports(1)
        server = uvicorn.Server(uvicorn.Config(create_app(pruner, ApiConfig(workers=w)), host="127.0.0.1",
                                               port=port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        servers[w] = (server, f"http://127.0.0.1:{port}")

    def measure(url: str, concurrency: int) -> tuple[float, float]:
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
        return args.calls * args.passages / wall, statistics.median(latencies) * 1000

    results: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in range(args.repeats):
        print(f"round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
        for c in (1, 16):
            for w in sizes:
                results.setdefault((w, c), []).append(measure(servers[w][1], c))
                print(f"  workers {w}, c{c}: {results[(w, c)][-1][0]:.1f} passages/s", file=sys.stderr, flush=True)
    for server, _ in servers.values():
        server.should_exit = True
    table = ["| workers | c1 passages/s | c1 p50 ms | c16 passages/s | c16 p50 ms |", "|---|---|---|---|---|"]
    for w in sizes:
        c1, c16 = results[(w, 1)], results[(w, 16)]
        table.append(f"| {w} | {statistics.median(x for x, _ in c1):.1f} | {statistics.median(y for _, y in c1):.0f} "
                     f"| {statistics.median(x for x, _ in c16):.1f} | {statistics.median(y for _, y in c16):.0f} |")
    import os
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    text = (f"# HTTP API: worker threads for one shared pruner\n\nCommand:\n\n```\n"
            f"{shlex.join(['python', '-m', 'benchmarks.api_workers', *(sys.argv[1:] if argv is None else argv)])}"
            f"\n```\n\nMachine: {machine}; model {args.model}, {args.passages} passages a call, {args.calls} calls "
            f"a measurement, medians of {args.repeats} interleaved rounds.\n\n" + "\n".join(table) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "api-workers.md").write_text(text)
    (out / "api-workers.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
