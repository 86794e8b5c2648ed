"""Speed of every path, side by side, on the RAG workload (`prune bench`).

Each query of `squad-dev-rag.jsonl` (a question and up to 20 passages) is one call of
the full pipeline: sentence splitting, tokenization, model, decisions. Paths, measured in
one run, interleaved over repeats, reported as medians:

- torch-unbatched: the fp32 PyTorch reference run the way users run Provence today, one
  passage per forward, no sorting (the baseline of the ratios);
- torch-batched: the same module with the engine's sorted token-budget batching;
- onnxruntime-fp32 / onnxruntime-int8: the exported graphs in-process;
- triton-grpc / triton-http at concurrency 1, 4, 16 (with --triton): the CPU repository
  served by a local tritonserver, the Python client tokenizing;
- with --replicas N: the same two over N servers through one multi-endpoint client;
- triton-text-grpc at concurrency 1, 4, 16: the text model (text in, everything on the
  server); and Triton's own perf_analyzer on the core and on the text model;
- api-text-grpc at concurrency 1, 4, 16: the HTTP API (`prune api`, its own process) in
  front of that text model, called on TEI's /rerank over keep-alive connections;
- onnxruntime-int8 in-process c1/c4/c16: one Pruner shared by every client thread, as a
  service shares it; api-in-process c1/c4/c16: `prune api --model` on that INT8 folder.

Also: where the time goes (client work vs model), the batching ablation (sorted token
budget vs fixed-size batches in input order), and the bytes per passage leaving the core.
Timings are never asserted in tests; they are printed with the machine and settings.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from engine.spec import Manifest
from engine.tools.measure import (
    PathResult,
    RerankClient,
    SharedPruner,
    client_share,
    core_input_data,
    machine_info,
    output_bytes,
    padding_share,
    perf_analyzer,
    run_concurrent,
    run_sequential,
    start_api,
    text_input_data,
    selects,
    wanted,
    workload_batches,
)
from engine.tools.peers import call_texts, embedding_peers
from engine.tools.quality import load_rag_data


def bench(models: dict[str, Path], checkpoint: str | None, data: Path, queries: int, repeats: int,
          threads: int | None, triton: bool, concurrencies=(1, 4, 16), log=print,
          out_dir: Path | None = None, only: str | None = None, text_instances: int = 4,
          perf: bool = True, replicas: int = 1, device: str = "cpu", server_url: str | None = None,
          text_model: str = "default_text", api_url: str | None = None) -> dict[str, Any]:
    """Every path side by side (see the module docstring); `only`: a regular expression,
    the paths whose names match it (a focused A/B with more repeats).

    An existing deployment: `server_url` (a Triton server, host:port; its text model
    `text_model` over gRPC) and `api_url` (the HTTP API, TEI's /rerank) add the paths
    `deployment-text-grpc cN` and `deployment-api cN`; with either and no `only`, only the
    deployment's paths run (the local model still gives the workload's token counts).

    `device="cuda"`: the same workload on the GPU: PyTorch fp32 (unbatched reference and
    batched) and fp16 batched, ONNX Runtime's CUDA provider with IO binding on the fp32
    export and on `models["fp16"]` where given (INT8 is a CPU precision and is left out;
    so is --triton, whose bench repository is the CPU one)."""
    from engine.batching import BatchingConfig
    from engine.pruner import Pruner
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda" and triton:
        raise ValueError("--triton serves the CPU repository: on a GPU, build one with prune repository "
                         "--target gpu and serve it in NVIDIA's container (docs/triton.md)")
    if (server_url or api_url) and only is None:
        only = "^deployment-"
    qs = load_rag_data(data, queries)
    n_passages = sum(len(q.passages) for q in qs)
    paths: dict[str, Callable[[PathResult], float]] = {}
    peers: dict[str, Any] = {}
    peer_dir = None
    fp32 = Pruner.load(models["fp32"], threads=threads, device=device)
    sorted_batches = workload_batches(fp32, qs)
    tokens = sum(int(b.attention_mask.sum()) for b in sorted_batches)
    on = "" if device == "cpu" else "-cuda"
    if checkpoint and wanted(only, ["torch-unbatched (reference)", "torch-batched", "torch-batched fp16", "peer: "]):
        ref = Pruner.load(checkpoint, backend="torch", threads=threads, device=device,
                          batching=BatchingConfig(max_batch_size=1, strategy="fixed"))
        batched = Pruner.load(checkpoint, backend="torch", threads=threads, device=device)
        paths["torch-unbatched (reference)"] = lambda r: run_sequential(ref, qs, r, per_passage=True)
        paths["torch-batched"] = lambda r: run_sequential(batched, qs, r)
        if device == "cuda":
            half = Pruner.load(checkpoint, backend="torch", threads=threads, device=device, dtype="float16")
            paths["torch-batched fp16"] = lambda r: run_sequential(half, qs, r)
        if fp32.family.name == "embedding" and wanted(only, ["peer: "]):
            peer_dir = tempfile.TemporaryDirectory(prefix="prune-bench-peers-")
            peers = embedding_peers(checkpoint, Path(peer_dir.name), device, threads, log)
            for name, peer in peers.items():
                paths[name] = lambda r, peer=peer: run_sequential(peer, qs, r)
    fixed = Pruner.load(models["fp32"], threads=threads, device=device,
                        batching=BatchingConfig(strategy="fixed", max_batch_size=8))
    fixed_batches = workload_batches(fixed, qs)
    paths[f"onnxruntime{on}-fp32"] = lambda r: run_sequential(fp32, qs, r)
    paths[f"onnxruntime{on}-fp32, fixed batches of 8 in input order"] = lambda r: run_sequential(fixed, qs, r)
    if "fp16" in models:
        fp16 = Pruner.load(models["fp16"], threads=threads, device=device)
        paths[f"onnxruntime{on}-fp16"] = lambda r: run_sequential(fp16, qs, r)
    if device == "cuda":
        models = {k: v for k, v in models.items() if k != "int8"}
    if "int8" in models:
        int8 = Pruner.load(models["int8"], threads=threads)
        paths["onnxruntime-int8"] = lambda r: run_sequential(int8, qs, r)
    server = None
    apis: list[subprocess.Popen] = []
    precision = 'int8' if 'int8' in models else 'fp32'
    if triton:
        import socket

        from engine.triton.server import TritonServer
        from export.triton import RepositoryOptions, build_repository
        repo = Path(tempfile.mkdtemp(prefix="prune-bench-repo-"))
        build_repository(models.get("int8", models["fp32"]), repo,
                         RepositoryOptions(target="cpu", name="bench", max_batch_size=64,
                                           intra_op_threads=threads or 0, text_instances=text_instances),
                         log=lambda m: None)
        servers = []
        for _ in range(max(1, replicas)):
            ports = []
            for _ in range(3):
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
                s.close()
            servers.append(TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2]))
            servers[-1].start()
        server = servers[0]
        if replicas > 1:   # the same load through one multi-endpoint client over every replica
            endpoints = [s.grpc_url for s in servers]
            for c in concurrencies:
                for model, label in (("bench", "triton-grpc"), ("bench_text", "triton-text-grpc")):
                    def multi(r, c=c, model=model):
                        return run_concurrent(lambda: Pruner.connect(endpoints, model), qs, c, r)
                    paths[f"{label} {replicas} replicas c{c} ({precision})"] = multi
        for proto in ("grpc", "http"):
            url = server.grpc_url if proto == "grpc" else server.http_url
            for c in concurrencies:
                def runner(r, url=url, proto=proto, c=c):
                    return run_concurrent(lambda: Pruner.connect(url, "bench", protocol=proto), qs, c, r)
                paths[f"triton-{proto} c{c} ({'int8' if 'int8' in models else 'fp32'})"] = runner
        def core_stats():
            import tritonclient.grpc as g
            st = g.InferenceServerClient(server.grpc_url).get_inference_statistics("bench").model_stats[0]
            return st.inference_stats.success.count, st.execution_count

        for c in concurrencies:   # the text model: text in, everything on the server
            def text_runner(r, c=c):
                req0, exe0 = core_stats()
                el = run_concurrent(lambda: Pruner.connect(server.grpc_url, "bench_text"), qs, c, r)
                req1, exe1 = core_stats()
                r.extra = {"core_requests": req1 - req0, "core_executions": exe1 - exe0}
                return el
            paths[f"triton-text-grpc c{c} ({precision})"] = text_runner
        if wanted(only, [f"api-text-grpc c{c} ({precision})" for c in concurrencies]):
            api_proc, api_url = start_api(["--server", server.grpc_url, "--text-model", "bench_text"], log)
            apis.append(api_proc)
            for c in concurrencies:   # the HTTP API in front of the same text model
                def api_runner(r, c=c):
                    return run_concurrent(lambda: RerankClient(api_url), qs, c, r)
                paths[f"api-text-grpc c{c} ({precision})"] = api_runner
    if "int8" in models:
        for c in concurrencies:   # one Pruner shared by the client threads, as a service shares it
            def ip(r, c=c):
                return run_concurrent(lambda: SharedPruner(int8), qs, c, r)
            paths[f"onnxruntime-int8 in-process c{c}"] = ip
        ip_args = ["--model", str(models["int8"])] + (["--threads", str(threads)] if threads else [])
        if wanted(only, [f"api-in-process c{c} (int8)" for c in concurrencies]):
            ip_proc, ip_url = start_api(ip_args, log)
            apis.append(ip_proc)
            for c in concurrencies:
                def ip_api(r, c=c):
                    return run_concurrent(lambda: RerankClient(ip_url), qs, c, r)
                paths[f"api-in-process c{c} (int8)"] = ip_api
    for c in concurrencies if server_url else ():     # an existing Triton deployment's text model
        def deployed(r, c=c):
            return run_concurrent(lambda: Pruner.connect(server_url, text_model), qs, c, r)
        paths[f"deployment-text-grpc c{c}"] = deployed
    for c in concurrencies if api_url else ():        # an existing HTTP API (TEI's /rerank)
        def deployed_api(r, c=c):
            return run_concurrent(lambda: RerankClient(api_url), qs, c, r)
        paths[f"deployment-api c{c}"] = deployed_api
    if only:
        paths = {k: v for k, v in paths.items() if selects(only, k)}
        if not paths:
            raise ValueError(f"no benchmark path matches {only!r}")
    results = {name: PathResult(name, passages=n_passages, tokens=tokens) for name in paths}
    try:
        for rep in range(repeats):   # interleaved: drift hits every path alike
            for name, fn in paths.items():
                el = fn(results[name])
                results[name].seconds.append(el)
                log(f"repeat {rep + 1}/{repeats} {name}: {el:.2f} s")
        pa = None
        if server is not None and out_dir is not None and perf:
            log("perf_analyzer ...")
            pa = {"bench": perf_analyzer(server.grpc_url, "bench", core_input_data(int8 if "int8" in models else fp32,
                                                                                 qs), concurrencies, out_dir),
                  "bench_text": perf_analyzer(server.grpc_url, "bench_text", text_input_data(qs), concurrencies,
                                              out_dir)}
    finally:
        for proc in apis:
            proc.terminate()
            proc.wait(60)
        if server is not None:
            for s in servers:
                s.stop()
    base_name = "torch-unbatched (reference)" if checkpoint else f"onnxruntime{on}-fp32"
    base = statistics.median(results[base_name].seconds) if base_name in results else None
    batched_t = statistics.median(results["torch-batched"].seconds) if "torch-batched" in results else None
    empty = [n for n, r in results.items() if not r.latencies]
    if empty:
        raise RuntimeError(f"no latencies for {empty}")
    rows = [r.summary(base) for r in results.values()]
    for row in rows:
        row["speedup_vs_torch_batched"] = (batched_t / row["seconds_median"]) if batched_t else None
    report = {
        "machine": machine_info(device),
        "settings": {"data": str(data), "queries": len(qs), "passages": n_passages, "tokens": tokens,
                     "device": device,
                     "repeats": repeats, "threads": threads, "models": {k: str(v) for k, v in models.items()},
                     "checkpoint": checkpoint, "only": only, "text_instances": text_instances,
                     "replicas": replicas, "server": server_url, "text_model": text_model if server_url else None,
                     "api": api_url,
                     "buckets": list(fp32.batching.buckets_for(fp32.spec.max_length)),
                     "max_batch_tokens": fp32.batching.max_batch_tokens},
        "paths": rows,
        "client": client_share(fp32, qs),
        "padding_share": {"sorted token budget": padding_share(sorted_batches),
                          "fixed batches of 8, input order": padding_share(fixed_batches)},
        "output_size": output_bytes(sorted_batches, n_passages),
        "perf_analyzer": pa,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device == "cpu":
        shapes = {"sorted": [b.input_ids.shape for b in sorted_batches],
                  "fixed": [b.input_ids.shape for b in fixed_batches]}
        sent = {"onnxruntime-fp32": ("fp32", "fp32", shapes["sorted"]),
                "torch-batched": ("fp32", "fp32", shapes["sorted"]),
                "onnxruntime-fp32, fixed batches of 8 in input order": ("fp32", "fp32", shapes["fixed"]),
                "onnxruntime-int8": ("int8", "int8", shapes["sorted"])}
        for name, peer in peers.items():
            if peer.graph is not None and name in results:
                sent[name] = (name, peer.precision,
                              [sh for q in qs for sh in peer.shapes(call_texts(q.question, q.passages)[0])])
        report["limits"] = machine_limits(rows, {**models, **{n: p.graph for n, p in peers.items() if p.graph}},
                                          threads, sent, log)
    if peer_dir is not None:      # the peers' plain exports (an error leaves them to its finalizer)
        peer_dir.cleanup()
    model_int8 = next((r for r in rows if r["path"] == "onnxruntime-int8"), None)
    if model_int8:
        report["client"]["share_of_int8_total"] = report["client"]["client_seconds"] / model_int8["seconds_median"]
    return report


def machine_limits(rows: list[dict[str, Any]], graphs: dict[str, Path], threads: int | None,
                   sent: dict[str, tuple[str, str, list]], log=print) -> dict[str, Any]:
    """This CPU's fp32 and int8 GEMM rates with ONNX Runtime, each graph's work per token
    (engine.tools.limits), and every in-process path's achieved rate as a share of the
    matching rate (`limit_share` in its row). `graphs`: an exported model folder (its
    manifest names the graph) or an ONNX file, by name; `sent`: path -> (the graph's name,
    precision, the padded (rows, length) batches the path sent)."""
    try:
        from engine.tools.limits import gemm_rates, graph_work, workload_flops
        rates = gemm_rates(threads)
    except ImportError as exc:     # onnx (the [export] extra) builds the GEMM graphs
        return {"skipped": f"needs {exc.name} (pip install 'prune-engine[export]')"}
    log(f"GEMM limit: fp32 {rates['fp32_gflops']:.0f} GFLOP/s, int8 {rates['int8_gops']:.0f} GOP/s")
    out: dict[str, Any] = {"gemm": rates, "work": {}}
    for name, where in graphs.items():
        where = Path(where)
        if where.is_dir():
            manifest = Manifest.read(where)
            work = graph_work(where / manifest.graph)
            work["hidden_size"] = int(manifest.source.hidden_size)
        else:                      # a plain export: config.json beside it
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
        limit = rates["int8_gops" if precision == "int8" else "fp32_gflops"]
        row.update(achieved_gflops=rate, limit_share=rate / limit,
                   limit=f"{'int8' if precision == 'int8' else 'fp32'} GEMM {limit:.0f} G/s")
    return out
