"""Does a request's answer depend on what Triton batches it with? A load test of the
default INT8 text model (#26), the cpu core joining the dynamic batcher's requests into
one run (`prune repository --join-requests always`) against running each alone (`never`,
the default for INT8 graphs: `auto`).

    python -m benchmarks.batch_company --rag ../shared/data/squad-dev-rag.jsonl \\
        --seconds 120 --out benchmarks/results/batch-company

One tritonserver serves both settings' models; in `--repeats` alternating rounds (ABBA...),
`--clients` concurrent gRPC clients send RAG calls, `--seconds` per setting in all (the question of a RAG item and its
first 1, 3, 5 or 10 passages, in a fixed cycle, so batches of several lengths meet). Every
answer is compared with the same call pruned alone by the in-process INT8 engine (same
graph, same batch cut: max_batch_size of the core): passages whose pruned text differs,
sentences whose kept flag differs, the largest |dp| (model scores and the default
decisions, lexical_weight included). Throughput: passages answered per second of the
load, all rounds together (and each round's: the machine's speed drifts, so compare the
rounds side by side); the core's requests and executions from Triton's
statistics. "calls differing" is the most distinct calls that differed in one round.
"""
from __future__ import annotations

import itertools
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from engine.tools.harness import Study, parser, stderr

SIZES = (1, 3, 5, 10)
SETTINGS = ("always", "never")


def _ports(n: int) -> list[int]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        out.append(s.getsockname()[1])
        s.close()
    return out


def calls_from(rag: Path, limit: int) -> list[tuple[str, list[str]]]:
    items = [json.loads(line) for line in rag.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(it["question"], it["passages"][:size])
            for it, size in zip(items[:limit], itertools.cycle(SIZES))]


def answer(results) -> list[tuple[str, list[bool], list[float]]]:
    return [(r.pruned_context, [s.kept for s in r.sentences], [float(np.float32(s.probability)) for s in r.sentences])
            for r in results]


def compare(got, exp) -> dict[str, float]:
    text = kept = sentences = 0
    dp = 0.0
    for (gt, gk, gp), (et, ek, ep) in zip(got, exp):
        text += gt != et
        kept += sum(a != b for a, b in zip(gk, ek))
        sentences += len(ek)
        if gp:
            dp = max(dp, float(np.max(np.abs(np.array(gp) - np.array(ep)))))
    return {"text": text, "kept": kept, "sentences": sentences, "dp": dp}


def core_stats(grpc_url: str, model: str) -> tuple[int, int]:
    import tritonclient.grpc as grpcclient
    st = grpcclient.InferenceServerClient(grpc_url).get_inference_statistics(model).model_stats[0]
    return st.inference_stats.success.count, st.execution_count


def load(grpc_url: str, model: str, calls, expected, clients: int, seconds: float, log) -> dict:
    from engine.pruner import Pruner
    conns = [Pruner.connect(grpc_url, model + "_text") for _ in range(clients)]
    for c in conns:  # warm the connection and the server's first runs
        c.prune(*calls[0])
    req0, exe0 = core_stats(grpc_url, model)
    lock = threading.Lock()
    totals = {"calls": 0, "passages": 0, "text": 0, "kept": 0, "sentences": 0, "dp": 0.0, "errors": []}
    per_call_differing: set[int] = set()
    stop = time.monotonic() + seconds
    start = time.monotonic()

    def client(k: int) -> None:
        i = k * 7
        while time.monotonic() < stop:
            j = i % len(calls)
            i += 1
            try:
                diff = compare(answer(conns[k].prune(*calls[j])), expected[j])
            except Exception as exc:  # counted and reported
                with lock:
                    totals["errors"].append(repr(exc))
                continue
            with lock:
                totals["calls"] += 1
                totals["passages"] += len(calls[j][1])
                for key in ("text", "kept", "sentences"):
                    totals[key] += diff[key]
                totals["dp"] = max(totals["dp"], diff["dp"])
                if diff["text"] or diff["kept"] or diff["dp"]:
                    per_call_differing.add(j)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if time.monotonic() - last > 15:
            last = time.monotonic()
            log(f"  {model}: {last - start:.0f} s, {totals['passages']} passages, "
                f"{totals['text']} with a different pruned text")
    wall = time.monotonic() - start
    req1, exe1 = core_stats(grpc_url, model)
    for c in conns:
        c.close()
    errors = totals.pop("errors")
    return {**totals, "seconds": round(wall, 1), "passages_per_s": round(totals["passages"] / wall, 1),
            "calls_differing": len(per_call_differing), "core_requests": req1 - req0,
            "core_executions": exe1 - exe0, "errors": len(errors), "first_errors": errors[:3]}


def merge(rounds: list[dict]) -> dict:
    """One setting's rounds together: passages/s over all its rounds, and each round's."""
    out = {k: sum(r[k] for r in rounds) for k in ("calls", "passages", "text", "kept", "sentences", "seconds",
                                                   "core_requests", "core_executions", "errors")}
    out["dp"] = max(r["dp"] for r in rounds)
    out["calls_differing"] = max(r["calls_differing"] for r in rounds)
    out["passages_per_s"] = round(out["passages"] / out["seconds"], 1)
    out["passages_per_s_rounds"] = [r["passages_per_s"] for r in rounds]
    out["first_errors"] = [e for r in rounds for e in r["first_errors"]][:3]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, out="benchmarks/results/batch-company", repeats=4)
    ap.add_argument("--rag", required=True, type=Path, help="RAG items (question, passages): squad-dev-rag.jsonl")
    ap.add_argument("--model", help="an exported INT8 folder (default: the default model's INT8 export)")
    ap.add_argument("--calls", type=int, default=120, help="distinct calls, cycled (default 120)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=120.0, help="load per setting, all rounds (default 120)")
    args = ap.parse_args(argv)
    study = Study("batch-company", "benchmarks.batch_company", argv)

    from engine.core.batching import BatchingConfig
    from engine.runtime.default_model import ensure_default_model
    from engine.pruner import Pruner
    from engine.triton.server import TritonServer
    from export.triton import RepositoryOptions, build_repository

    log = stderr
    model = Path(args.model) if args.model else Path(ensure_default_model(log, precision="int8"))
    calls = calls_from(args.rag, args.calls)
    max_batch = 64
    local = Pruner.load(model, batching=BatchingConfig(max_batch_size=max_batch))
    log(f"{len(calls)} calls pruned alone in process (the reference)")
    expected = [answer(local.prune(q, ps)) for q, ps in calls]
    local.close()

    report = {"model": str(model), "clients": args.clients, "seconds": args.seconds, "calls": len(calls),
              "rounds": args.repeats, "sizes": list(SIZES), "settings": {}}
    with tempfile.TemporaryDirectory(prefix="prune-company-") as tmp:
        repo = Path(tmp) / "repo"
        for join in SETTINGS:
            build_repository(model, repo, RepositoryOptions(target="cpu", name=f"int8_{join}", max_batch_size=max_batch,
                                                            join_requests=join, intra_op_threads=args.threads or 0),
                             log=lambda m: None)
        h, g, m = _ports(3)
        with TritonServer(repo, http_port=h, grpc_port=g, metrics_port=m) as server:
            rounds: dict[str, list[dict]] = {join: [] for join in SETTINGS}
            for k in range(args.repeats):
                for join in (SETTINGS if k % 2 == 0 else SETTINGS[::-1]):
                    log(f"round {k + 1}/{args.repeats}, join_requests {join}: {args.clients} clients for "
                        f"{args.seconds / args.repeats:.0f} s")
                    rounds[join].append(load(server.grpc_url, f"int8_{join}", calls, expected, args.clients,
                                             args.seconds / args.repeats, log))
                    log(json.dumps(rounds[join][-1]))
            report["settings"] = {join: merge(rs) for join, rs in rounds.items()}
    study.write(args.out, report, format_report(study, report))
    return 0


def format_report(study: Study, rep: dict) -> list[str]:
    lines = study.header("Batch company: does a request's answer depend on the requests batched with it?")
    lines += [f"{rep['model']}; {rep['clients']} gRPC clients, {rep['seconds']:.0f} s per setting in "
             f"{rep['rounds']} alternating rounds, "
             f"{rep['calls']} distinct calls of {'/'.join(map(str, rep['sizes']))} passages; every answer against "
             "the same call pruned alone in process.", "",
             "| core (join_requests) | passages/s (each round) | passages | core requests / executions | pruned text differs "
             "| kept flags differ | max abs dp | calls differing | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for join, r in rep["settings"].items():
        rounds = ", ".join(f"{x:.0f}" for x in r["passages_per_s_rounds"])
        lines.append(f"| {join} | {r['passages_per_s']} ({rounds}) | {r['passages']} | {r['core_requests']} / "
                     f"{r['core_executions']} | {r['text']} ({100 * r['text'] / max(1, r['passages']):.2f}%) | "
                     f"{r['kept']} of {r['sentences']} | {r['dp']:.2g} | {r['calls_differing']} of {rep['calls']} "
                     f"| {r['errors']} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
