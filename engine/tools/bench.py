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
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.tools.peers import call_texts, embedding_peers
from engine.tools.quality import load_rag_data
from engine.spec import Manifest


@dataclass
class PathResult:
    """One measured path: its passages/s over repeats, latency and what it ran."""
    name: str
    seconds: list[float] = field(default_factory=list)       # per repeat, whole workload
    latencies: list[float] = field(default_factory=list)     # per query, last repeat
    passages: int = 0
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)      # per-path counters (last repeat)

    def summary(self, baseline: float | None) -> dict[str, Any]:
        """The path's row: medians, spread and its speed against `baseline`."""
        t = statistics.median(self.seconds)
        lat = np.array(self.latencies) * 1000
        return {"path": self.name, "seconds_median": t, "seconds": self.seconds,
                "passages_per_s": self.passages / t, "tokens_per_s": self.tokens / t,
                "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
                "p99_ms": float(np.percentile(lat, 99)),
                "speedup_vs_reference": (baseline / t) if baseline else None, **self.extra}


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """The machine, in a benchmark's words: CPU, cores, flags, memory, versions."""
    import onnxruntime
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def workload_batches(pruner, queries) -> list:
    """The padded batches the engine sends for the workload (one call per query)."""
    from engine.text import split_sentences
    out = []
    for q in queries:
        out += pruner.batches(pruner.encode(q.question, q.passages, [split_sentences(p) for p in q.passages]))
    return out


def run_sequential(pruner, queries, res: PathResult, per_passage: bool = False) -> float:
    """One call per query, or (per_passage) one call and forward per passage, in input order."""
    lat = []
    t0 = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        if per_passage:
            for p in q.passages:
                pruner.prune(q.question, [p])
        else:
            pruner.prune(q.question, q.passages)
        lat.append(time.perf_counter() - t)
    el = time.perf_counter() - t0
    res.latencies = lat
    return el


def run_concurrent(make_client: Callable[[], Any], queries, concurrency: int, res: PathResult) -> float:
    """`concurrency` client threads share the queries; each makes its own client in its
    own thread (the HTTP client is gevent-based and bound to one thread)."""
    lat: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    nxt = iter(range(len(queries)))
    ready = threading.Barrier(concurrency + 1)
    go = threading.Event()

    def work():
        c = None
        try:
            c = make_client()
        except BaseException as exc:
            errors.append(exc)
        ready.wait()
        go.wait()
        try:
            while c is not None:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                t = time.perf_counter()
                c.prune(queries[i].question, queries[i].passages)
                with lock:
                    lat.append(time.perf_counter() - t)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if c is not None:
                c.close()

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    for t in threads:
        t.start()
    ready.wait()            # clients are connected; time only the work
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    el = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    res.latencies = lat
    return el


class _Shared:
    """One pruner handed to every client thread of run_concurrent (which closes each
    thread's client): closing it is its owner's business."""

    def __init__(self, pruner):
        self.prune = pruner.prune

    def close(self) -> None:
        pass


class _RerankClient:
    """A client of the HTTP API's TEI /rerank on one keep-alive connection (the stdlib's,
    so the bench needs nothing the API's users would not have)."""

    def __init__(self, url: str):
        import http.client
        from urllib.parse import urlsplit
        u = urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)

    def prune(self, question: str, passages: list[str]) -> list[dict[str, Any]]:
        self._conn.request("POST", "/rerank", body=json.dumps({"query": question, "texts": passages}),
                           headers={"Content-Type": "application/json"})
        r = self._conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"/rerank answered {r.status}: {body[:300]!r}")
        out = json.loads(body)
        if len(out) != len(passages):
            raise RuntimeError(f"/rerank returned {len(out)} results for {len(passages)} texts")
        return out

    def close(self) -> None:
        self._conn.close()


def _wanted(only: str | None, names: list[str]) -> bool:
    """Whether --paths keeps any of these paths (a server is started only for paths run)."""
    return not only or any(re.search(only, n) for n in names)


def start_api(args: list[str], log=print, timeout: float = 300.0) -> tuple[subprocess.Popen, str]:
    """`prune api ARGS` as its own process (its own interpreter, as deployed) on a free
    loopback port; returns it and its URL once /health answers."""
    import socket
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "engine", "api", "--quiet", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"prune api {' '.join(args)} exited: {err}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    log(f"prune api {' '.join(args)}: {url}")
                    return proc, url
        except OSError:
            time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"prune api {' '.join(args)} did not answer /health within {timeout:.0f} s")


def client_share(pruner, queries) -> dict[str, float]:
    """Time of the client-side work alone (split, tokenize, encode, batch, decide)."""
    from engine.decide import build_result, keep_mask
    from engine.text import split_sentences
    fam = pruner.family
    t0 = time.perf_counter()
    n = 0
    for q in queries:
        spans = [split_sentences(p) for p in q.passages]
        blocks = pruner.encode(q.question, q.passages, spans)
        pruner.batches(blocks)
        for p, sp in zip(q.passages, spans):
            probs = np.full(len(sp), 0.5)
            build_result(0, p, sp, probs, keep_mask(probs, fam, fam.threshold, fam.title, fam.backoff_alpha),
                         0.0, fam.threshold, 1)
        n += len(q.passages)
    el = time.perf_counter() - t0
    return {"client_seconds": el, "client_passages_per_s_one_core": n / el}


def padding_share(batches) -> float:
    """The share of padding tokens in `batches`."""
    real = sum(int(b.attention_mask.sum()) for b in batches)
    padded = sum(b.attention_mask.size for b in batches)
    return 1 - real / padded if padded else 0.0


def output_bytes(batches, n_passages: int) -> dict[str, float]:
    """Bytes leaving the core per passage: pooled (B + B x S floats) vs raw token
    outputs (B x L x 2 floats, what a graph without in-graph pooling returns)."""
    pooled = sum(4 * b.shape[0] * (1 + int(b.sentence_ids.max()) + 1) for b in batches)
    raw = sum(4 * b.shape[0] * b.shape[1] * 2 for b in batches)
    return {"pooled_bytes_per_passage": pooled / n_passages, "raw_token_bytes_per_passage": raw / n_passages,
            "reduction": raw / pooled if pooled else 0.0}


def core_input_data(pruner, queries) -> list[dict[str, Any]]:
    """perf_analyzer input data for the core model: one real block of the workload per request."""
    data = []
    for b in workload_batches(pruner, queries[:20]):
        for r in range(b.shape[0]):
            data.append({n: {"content": getattr(b, n)[r].tolist(), "shape": [b.shape[1]]}
                         for n in pruner.spec.input_names})
    return data


def text_input_data(queries) -> list[dict[str, Any]]:
    """perf_analyzer input data for the text model: one query (question and passages) per request."""
    return [{"question": {"content": [q.question], "shape": [1]},
             "passages": {"content": list(q.passages), "shape": [len(q.passages)]}} for q in queries[:20]]


def perf_analyzer(server_grpc: str, model: str, data: list[dict[str, Any]], concurrencies,
                  out_dir: Path) -> dict[str, Any]:
    """Triton's perf_analyzer on real requests of the workload (its JSON input data)."""
    import shutil
    # the tritonclient 2.51 wheel installs the real binary beside this interpreter
    found = Path(sys.executable).parent / "perf_analyzer"
    binary = found if found.is_file() else Path(shutil.which("perf_analyzer") or "perf_analyzer")
    if not binary.is_file():
        return {"skipped": "no perf_analyzer binary (pip install 'tritonclient[http,grpc]==2.51.0')"}
    data_file = out_dir / f"perf_analyzer_input_{model}.json"
    data_file.write_text(json.dumps({"data": data}))
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime
        cuda_lib = Path(nvidia.cuda_runtime.__path__[0]) / "lib"
        env["LD_LIBRARY_PATH"] = f"{cuda_lib}:{env.get('LD_LIBRARY_PATH', '')}"
    except ImportError:
        pass
    results = {}
    for c in concurrencies:
        csv = out_dir / f"perf_analyzer_{model}_c{c}.csv"
        # a shared 2-core machine is noisy: longer windows and a looser stability band
        cmd = [str(binary), "-m", model, "-u", server_grpc, "-i", "grpc", "--input-data", str(data_file),
               "--concurrency-range", f"{c}:{c}", "--measurement-interval", "8000", "-f", str(csv),
               "--percentile", "95", "--stability-percentage", "50", "--max-trials", "6"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
        if proc.returncode != 0:
            return {"skipped": f"perf_analyzer failed: {(proc.stderr or proc.stdout)[-400:]}"}
        rows = [line.split(",") for line in csv.read_text().splitlines()]
        head, vals = rows[0], rows[1]
        rec = dict(zip(head, vals))
        results[str(c)] = {k: float(v) for k, v in rec.items() if v.replace(".", "", 1).isdigit()}
    return results


def bench(models: dict[str, Path], checkpoint: str | None, data: Path, queries: int, repeats: int,
          threads: int | None, triton: bool, concurrencies=(1, 4, 16), log=print,
          out_dir: Path | None = None, only: str | None = None, text_instances: int = 4,
          perf: bool = True, replicas: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Every path side by side (see the module docstring); `only`: a regular expression,
    the paths whose names match it (a focused A/B with more repeats).

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
    qs = load_rag_data(data, queries)
    n_passages = sum(len(q.passages) for q in qs)
    paths: dict[str, Callable[[PathResult], float]] = {}
    peers: dict[str, Any] = {}
    peer_dir = None
    fp32 = Pruner.load(models["fp32"], threads=threads, device=device)
    sorted_batches = workload_batches(fp32, qs)
    tokens = sum(int(b.attention_mask.sum()) for b in sorted_batches)
    on = "" if device == "cpu" else "-cuda"
    if checkpoint:
        ref = Pruner.load(checkpoint, backend="torch", threads=threads, device=device,
                          batching=BatchingConfig(max_batch_size=1, strategy="fixed"))
        batched = Pruner.load(checkpoint, backend="torch", threads=threads, device=device)
        paths["torch-unbatched (reference)"] = lambda r: run_sequential(ref, qs, r, per_passage=True)
        paths["torch-batched"] = lambda r: run_sequential(batched, qs, r)
        if device == "cuda":
            half = Pruner.load(checkpoint, backend="torch", threads=threads, device=device, dtype="float16")
            paths["torch-batched fp16"] = lambda r: run_sequential(half, qs, r)
        if fp32.family.name == "embedding" and _wanted(only, ["peer: "]):
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
        from engine.triton.server import TritonServer
        from export.triton import RepositoryOptions, build_repository
        import socket
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
        if _wanted(only, [f"api-text-grpc c{c} ({precision})" for c in concurrencies]):
            api_proc, api_url = start_api(["--server", server.grpc_url, "--text-model", "bench_text"], log)
            apis.append(api_proc)
            for c in concurrencies:   # the HTTP API in front of the same text model
                def api_runner(r, c=c):
                    return run_concurrent(lambda: _RerankClient(api_url), qs, c, r)
                paths[f"api-text-grpc c{c} ({precision})"] = api_runner
    if "int8" in models:
        for c in concurrencies:   # one Pruner shared by the client threads, as a service shares it
            def ip(r, c=c):
                return run_concurrent(lambda: _Shared(int8), qs, c, r)
            paths[f"onnxruntime-int8 in-process c{c}"] = ip
        ip_args = ["--model", str(models["int8"])] + (["--threads", str(threads)] if threads else [])
        if _wanted(only, [f"api-in-process c{c} (int8)" for c in concurrencies]):
            ip_proc, ip_url = start_api(ip_args, log)
            apis.append(ip_proc)
            for c in concurrencies:
                def ip_api(r, c=c):
                    return run_concurrent(lambda: _RerankClient(ip_url), qs, c, r)
                paths[f"api-in-process c{c} (int8)"] = ip_api
    if only:
        paths = {k: v for k, v in paths.items() if re.search(only, k)}
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
                     "replicas": replicas,
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


def markdown(report: dict[str, Any], command: str) -> str:
    """The benchmark's report as markdown, with the command that made it."""
    m, s = report["machine"], report["settings"]
    lines = [f"# Benchmark {report['date']}", "", "Command:", "", "```", command, "```", "",
             f"Machine: {m.get('cpu_model', m['processor'])}, {m['cpus']} CPUs; Python {m['python']}, "
             f"onnxruntime {m['onnxruntime']}, torch {m.get('torch', '-')}.",
             f"Workload: {s['queries']} queries, {s['passages']} passages, {s['tokens']} tokens (with special "
             f"tokens, unpadded) of {s['data']}; {s['repeats']} repeats, medians; threads {s['threads']}.", "",
             "| path | passages/s | tokens/s | p50 ms | p95 ms | p99 ms | vs reference | vs torch batched |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["paths"]:
        vs = f"{r['speedup_vs_reference']:.2f}x" if r["speedup_vs_reference"] else "-"
        vb = f"{r['speedup_vs_torch_batched']:.2f}x" if r.get("speedup_vs_torch_batched") else "-"
        lines.append(f"| {r['path']} | {r['passages_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {vs} | {vb} |")
    limits = report.get("limits") or {}
    if "gemm" in limits:
        g = limits["gemm"]
        lines += ["", f"This machine's limit (ONNX Runtime, {g['shape'][0]}x{g['shape'][1]} by {g['shape'][1]}x"
                  f"{g['shape'][2]}, threads {g['threads']}): fp32 MatMul {g['fp32_gflops']:.0f} GFLOP/s, int8 "
                  f"MatMulInteger {g['int8_gops']:.0f} GOP/s. Work per token from the graph: "
                  + ", ".join(f"{k} {w['linear_flops_per_token'] / 1e6:.1f} MFLOP in weight products and "
                              f"{w['activation_products']:.0f} activation products of 2 x L x {w['hidden_size']}"
                              for k, w in limits["work"].items()) + " (L the padded length sent).", "",
                  "| path | achieved G(FL)OP/s | share of the limit |", "|---|---|---|"]
        lines += [f"| {r['path']} | {r['achieved_gflops']:.0f} | {100 * r['limit_share']:.0f}% of the {r['limit']} |"
                  for r in report["paths"] if "limit_share" in r]
    elif limits:
        lines += ["", f"Machine limit: {limits['skipped']}."]
    core = [r for r in report["paths"] if "core_requests" in r]
    if core:
        lines += ["", "Core model under the text model (last repeat): " + "; ".join(
            f"{r['path']}: {r['core_requests']} BLS requests in {r['core_executions']} executions"
            for r in core) + "."]
    by_path = {r["path"]: r for r in report["paths"]}
    api_vs = []
    for conc in (1, 4, 16):
        api = next((r for n, r in by_path.items() if n.startswith(f"api-text-grpc c{conc} ")), None)
        grpc = next((r for n, r in by_path.items() if n.startswith(f"triton-text-grpc c{conc} ")), None)
        if api and grpc:
            api_vs.append(f"c{conc}: {100 * api['passages_per_s'] / grpc['passages_per_s']:.0f}% of its throughput, "
                          f"p50 {api['p50_ms'] - grpc['p50_ms']:+.1f} ms")
    if api_vs:
        lines += ["", "The HTTP API in front of the text model, against the text model over gRPC: "
                  + "; ".join(api_vs) + "."]
    c = report["client"]
    lines += ["", "Client-side work (split, tokenize, encode, batch, decide): "
              f"{c['client_passages_per_s_one_core']:.0f} "
              f"passages/s on one core" + (f"; {100 * c['share_of_int8_total']:.1f}% of the INT8 path's total time."
                                           if "share_of_int8_total" in c else "."),
              "", "Padding share of the tokens sent to the model: " + ", ".join(
                  f"{k} {100 * v:.1f}%" for k, v in report["padding_share"].items()) + ".",
              "", "Bytes returned per passage: in-graph sentence pooling {:.0f}, raw token outputs {:.0f} "
              "({:.0f}x less).".format(report["output_size"]["pooled_bytes_per_passage"],
                                      report["output_size"]["raw_token_bytes_per_passage"],
                                      report["output_size"]["reduction"])]
    what = {"bench": "the core model, one real block of the workload per request",
            "bench_text": "the text model, one real query (question and its passages, BYTES) per request"}
    for model, pa in (report.get("perf_analyzer") or {}).items():
        if pa and "skipped" not in pa:
            lines += ["", f"perf_analyzer (Triton's load generator, gRPC) on {what.get(model, model)}:", "",
                      "| concurrency | inferences/s | p50 us | p95 us | p99 us | server queue us | "
                      "server compute infer us |", "|---|---|---|---|---|---|---|"]
            for conc, r in pa.items():
                lines.append(f"| {conc} | {r.get('Inferences/Second', 0):.1f} | {r.get('p50 latency', 0):.0f} | "
                             f"{r.get('p95 latency', 0):.0f} | {r.get('p99 latency', 0):.0f} | "
                             f"{r.get('Server Queue', 0):.0f} | {r.get('Server Compute Infer', 0):.0f} |")
        elif pa:
            lines += ["", f"perf_analyzer ({model}): {pa['skipped']}"]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """A bar chart of passages/s per path, written to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = report["paths"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    names = [r["path"] for r in rows]
    axes[0].barh(names, [r["passages_per_s"] for r in rows], color="tab:blue")
    axes[0].set_xlabel("passages / s (higher is better)")
    axes[0].invert_yaxis()
    y = np.arange(len(rows))
    for k, (key, color) in enumerate([("p50_ms", "tab:green"), ("p95_ms", "tab:orange"), ("p99_ms", "tab:red")]):
        axes[1].barh(y + (k - 1) * 0.27, [r[key] for r in rows], height=0.27, color=color, label=key[:3])
    axes[1].set_yticks(y, names)
    axes[1].invert_yaxis()
    axes[1].set_xlabel("latency per query, ms (lower is better)")
    axes[1].legend()
    fig.suptitle(f"prune-engine, {report['settings']['queries']} RAG queries, "
                 f"{report['machine'].get('cpu_model', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
