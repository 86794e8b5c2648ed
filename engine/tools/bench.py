"""`prune bench`: the speed of every path, side by side, on a RAG workload.

Built in three parts:

- **the registry** (`registry`): every path the options make possible, each a `BenchPath`
  with a stable id, a group and a `start` that builds what it needs (a Pruner, a
  tritonserver, a `prune api` process) only when the path is selected;
- **the runner** (`measure`): starts the selected paths, then runs them interleaved over
  the repeats (`engine.tools.harness.interleave`) so that drift hits them alike;
- **the report** (`report`): medians, latencies, the machine, the batching ablation,
  the client's share, bytes per passage, perf_analyzer and each path's share of this
  machine's GEMM rate (`bench_report` writes it as markdown and a chart).

Each query of the data (a question and its passages) is one call of the full pipeline:
sentence splitting, tokenization, model, decisions. The groups:

- reference: `torch-unbatched (reference)` (the fp32 PyTorch module one passage per
  forward, as users run Provence today: the ratios' baseline), `torch-batched`;
- peer: fastembed fp32/int8 and sentence-transformers on the same checkpoint (embedding
  family);
- in-process: the exported graphs through ONNX Runtime, the batching ablation (fixed
  batches of 8 in input order), and INT8 shared by 1/4/16 client threads;
- triton (`--triton`): the CPU repository under a local tritonserver over gRPC and HTTP,
  its text model, the HTTP API in front of it, and with `--replicas N` one client over N
  servers; perf_analyzer on the core and the text model;
- api: `prune api --model` on the INT8 folder, TEI's /rerank;
- deployment (`--server`, `--api`): an existing deployment's text model and HTTP API.

Timings are never asserted in tests; they are printed with the machine and settings.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.spec import Manifest
from engine.tools.harness import interleave, machine_info
from engine.tools.measure import (
    PathResult,
    RerankClient,
    SharedPruner,
    client_share,
    core_input_data,
    output_bytes,
    padding_share,
    path_id,
    perf_analyzer,
    run_concurrent,
    run_sequential,
    selects,
    start_api,
    text_input_data,
    workload_batches,
)
from engine.tools.peers import call_texts
from engine.tools.quality import load_rag_data

Runner = Callable[[PathResult], float]     # runs the workload once; its seconds
GROUPS = ("reference", "peer", "in-process", "triton", "api", "deployment")
PEERS = {"fastembed-fp32": "peer: fastembed (ONNX Runtime fp32, plain export; embed + cosine, no decisions)",
         "fastembed-int8": "peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, "
                           "no decisions)",
         "sentence-transformers": "peer: sentence-transformers (torch fp32; encode + cosine, no decisions)"}


@dataclass(frozen=True)
class BenchOptions:
    """What `prune bench` measures: the models, the workload and which paths."""
    models: dict[str, Path]                 # "fp32" (required), "int8", "fp16": exported folders
    data: Path
    checkpoint: str | None = None           # the PyTorch reference paths and the peers
    queries: int = 30
    repeats: int = 3
    threads: int | None = None
    triton: bool = False
    concurrencies: tuple[int, ...] = (1, 4, 16)
    only: str | None = None                 # a regular expression on names and ids
    text_instances: int = 4
    perf: bool = True
    perf_analyzer: str | None = None        # the binary (default: beside the interpreter, then PATH)
    perf_window_ms: int = 8000              # each of perf_analyzer's measurement windows
    replicas: int = 1
    device: str = "cpu"
    server_url: str | None = None
    text_model: str = "default_text"
    api_url: str | None = None
    openvino: bool = False                  # OpenVINO fp32, bf16 (where the CPU has it) and static INT8
    peer_python: str | None = None          # an interpreter with sentence-transformers[onnx,openvino]

    def __post_init__(self):
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and self.triton:
            raise ValueError("--triton serves the CPU repository: on a GPU, build one with prune repository "
                             "--target gpu and serve it in NVIDIA's container (docs/triton.md)")
        if self.repeats < 1 or self.queries < 1:
            raise ValueError("--repeats and --queries must be at least 1")


@dataclass
class BenchPath:
    """One path of the registry: its display name, group, how to start it, and which
    graph, precision and batches its share of the machine's GEMM rate is computed on."""
    name: str
    group: str
    start: Callable[["Session"], Runner | None]    # None: not measurable here (logged why)
    graph: str | None = None          # a models key or a peer's id
    precision: str = "fp32"
    batches: str = "sorted"           # "sorted", "fixed" or "peer"

    @property
    def id(self) -> str:
        """The path's stable id (`measure.path_id`)."""
        return path_id(self.name)


@dataclass
class Session:
    """What the selected paths share while they run, started on first use and closed
    at the end: Pruners, tritonservers, `prune api` processes, the peers' exports."""
    options: BenchOptions
    queries: list
    log: Callable[[str], None] = print
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _cache: dict[Any, Any] = field(default_factory=dict)

    def started(self, key: Any) -> bool:
        """Whether `key` (e.g. "servers", "peers") was started by a path."""
        return key in self._cache

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        """`make()` the first time `key` is asked for, the same object after."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def pruner(self, model: str = "fp32", **kw) -> Any:
        """An exported model in-process (`model` a models key: fp32, int8, fp16); `kw`:
        Pruner.load's (backend: onnxruntime unless it says otherwise, whatever runtime the
        export prefers, so each path runs what its name says)."""
        from engine.pruner import Pruner
        o = self.options
        kw.setdefault("backend", "onnxruntime")
        device = "cpu" if model == "int8" or kw["backend"] == "openvino" else o.device
        return self.once(("pruner", model, tuple(sorted(kw.items()))),
                         lambda: Pruner.load(o.models[model], threads=o.threads, device=device, **kw))

    def ov_int8(self, precision: str = "fp32") -> Any:
        """The static INT8 OpenVINO export: `models["ov-int8"]`, else made here from the fp32
        export (NNCF, its default settings; it lives until the end); what it keeps float
        computed at `precision` (fp32, or bf16 where the CPU has it)."""
        from engine.pruner import Pruner
        o = self.options

        def make():
            folder = o.models.get("ov-int8")
            if folder is None:
                from export.openvino import quantize
                folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-ov-"))) / "m"
                self.log("openvino-int8: quantizing the fp32 export with NNCF ...")
                quantize(o.models["fp32"], folder, log=lambda m: None)
            return folder
        folder = self.once("ov-int8", make)
        return self.once(("ov-int8", precision),
                         lambda: Pruner.load(folder, backend="openvino", precision=precision, threads=o.threads))

    def batches(self) -> list:
        """The padded batches the engine sends for the workload (fp32 export, its batching)."""
        return self.once("batches", lambda: workload_batches(self.pruner("fp32"), self.queries))

    def torch(self, **kw) -> Any:
        """The checkpoint through the PyTorch reference backend."""
        from engine.pruner import Pruner
        o = self.options
        return self.once(("torch", tuple(sorted(kw.items()))),
                         lambda: Pruner.load(o.checkpoint, backend="torch", threads=o.threads, device=o.device,
                                             **kw))

    def servers(self) -> list:
        """The local tritonservers (`--replicas` of them) on the bench repository."""
        return self.once("servers", self._start_servers)

    def _start_servers(self) -> list:
        import socket

        from engine.triton.server import TritonServer
        from export.triton import RepositoryOptions, build_repository
        o = self.options
        repo = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-repo-")))
        build_repository(o.models.get("int8", o.models["fp32"]), repo,
                         RepositoryOptions(target="cpu", name="bench", max_batch_size=64,
                                           intra_op_threads=o.threads or 0, text_instances=o.text_instances),
                         log=lambda m: None)
        servers = []
        for _ in range(max(1, o.replicas)):
            ports = []
            for _ in range(3):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            server = TritonServer(repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2])
            server.start()
            self.stack.callback(server.stop)
            servers.append(server)
        self.log(f"tritonserver x{len(servers)}: {', '.join(s.grpc_url for s in servers)}")
        return servers

    def api(self, args: list[str]) -> str:
        """`prune api ARGS` as its own process; its URL."""
        def start():
            proc, url = start_api(args, self.log)
            self.stack.callback(lambda: (proc.terminate(), proc.wait(60)))
            return url
        return self.once(("api", tuple(args)), start)

    def peers(self) -> dict[str, Any]:
        """The peers that install here, by id (their plain exports live until the end)."""
        from engine.tools.peers import embedding_peers
        o = self.options

        def make():
            folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-peers-")))
            by_name = embedding_peers(o.checkpoint, folder, o.device, o.threads, self.log)
            return {pid: by_name[name] for pid, name in PEERS.items() if name in by_name}
        return self.once("peers", make)

    def remote_peer(self, backend: str) -> Any:
        """sentence-transformers' `backend` (onnx, openvino) in `peer_python`'s environment,
        its export in a folder that lives until the end, its worker closed at the end."""
        from engine.tools.peers import remote_peers
        o = self.options

        def make():
            folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-st-")))
            ((peer, worker),) = remote_peers(o.peer_python, o.checkpoint, folder, self.log, (backend,)).values()
            self.stack.callback(worker.close)
            return peer
        return self.once(("remote-peer", backend), make)


def _sequential(pruner_of: Callable[["Session"], Any], per_passage: bool = False):
    def start(s: Session) -> Runner:
        pruner = pruner_of(s)
        return lambda r: run_sequential(pruner, s.queries, r, per_passage=per_passage)
    return start


def _concurrent(client_of: Callable[["Session"], Callable[[], Any]], c: int):
    def start(s: Session) -> Runner:
        make = client_of(s)
        return lambda r: run_concurrent(make, s.queries, c, r)
    return start


def _peer(pid: str):
    def start(s: Session) -> Runner | None:
        peer = s.peers().get(pid)
        if peer is None:
            return None
        return lambda r: run_sequential(peer, s.queries, r)
    return start


def _remote_peer(backend: str):
    def start(s: Session) -> Runner:
        peer = s.remote_peer(backend)
        return lambda r: run_sequential(peer, s.queries, r)
    return start


def _text_model(c: int):
    def start(s: Session) -> Runner:
        from engine.pruner import Pruner
        server = s.servers()[0]

        def core_stats():
            import tritonclient.grpc as g
            st = g.InferenceServerClient(server.grpc_url).get_inference_statistics("bench").model_stats[0]
            return st.inference_stats.success.count, st.execution_count

        def run(r: PathResult) -> float:
            req0, exe0 = core_stats()
            el = run_concurrent(lambda: Pruner.connect(server.grpc_url, "bench_text"), s.queries, c, r)
            req1, exe1 = core_stats()
            r.extra = {"core_requests": req1 - req0, "core_executions": exe1 - exe0}
            return el
        return run
    return start


def _bf16(name: str, make: Callable[[Session], Any]) -> Callable[[Session], Runner | None]:
    """A path computing in bf16 on OpenVINO: `make(session)`'s pruner, where the CPU has bf16."""
    def start(s: Session) -> Runner | None:
        from engine.backends.openvino import bf16_supported
        from engine.cpu import BF16_MISSING
        if not bf16_supported():
            s.log(f"{name}: {BF16_MISSING}")
            return None
        return _sequential(make)(s)
    return start


def _triton_core(proto: str, replicas: bool = False, model: str = "bench"):
    def client_of(s: Session) -> Callable[[], Any]:
        from engine.pruner import Pruner
        if replicas:         # one multi-endpoint client over every replica
            urls = [x.grpc_url for x in s.servers()]
            return lambda: Pruner.connect(urls, model)
        url = getattr(s.servers()[0], f"{proto}_url")
        return lambda: Pruner.connect(url, model, protocol=proto)
    return client_of


def _rerank(args: Callable[[Session], list[str]] | None = None, url: str | None = None):
    def client_of(s: Session) -> Callable[[], Any]:
        where = url or s.api(args(s))
        return lambda: RerankClient(where)
    return client_of


def _shared(precision: str):
    def client_of(s: Session) -> Callable[[], Any]:
        pruner = s.pruner(precision)
        return lambda: SharedPruner(pruner)
    return client_of


def _deployed(url: str, model: str):
    def client_of(s: Session) -> Callable[[], Any]:
        from engine.pruner import Pruner
        return lambda: Pruner.connect(url, model)
    return client_of


def registry(o: BenchOptions, family: str) -> list[BenchPath]:
    """Every path these options make possible, in report order; nothing is started."""
    from engine.batching import BatchingConfig
    on = "" if o.device == "cpu" else "-cuda"
    cs = o.concurrencies
    int8 = "int8" in o.models and o.device == "cpu"
    precision = "int8" if "int8" in o.models else "fp32"
    unbatched = BatchingConfig(max_batch_size=1, strategy="fixed")
    fixed = BatchingConfig(strategy="fixed", max_batch_size=8)
    paths: list[BenchPath] = []
    if o.checkpoint:
        paths += [BenchPath("torch-unbatched (reference)", "reference",
                            _sequential(lambda s: s.torch(batching=unbatched), per_passage=True)),
                  BenchPath("torch-batched", "reference", _sequential(lambda s: s.torch()), "fp32")]
        if o.device == "cuda":
            paths.append(BenchPath("torch-batched fp16", "reference", _sequential(lambda s: s.torch(dtype="float16"))))
        if family == "embedding":
            paths += [BenchPath(name, "peer", _peer(pid), pid, "int8" if pid.endswith("int8") else "fp32", "peer")
                      for pid, name in PEERS.items()]
            if o.peer_python:
                from engine.tools.peers import REMOTE_PEERS
                paths += [BenchPath(name, "peer", _remote_peer(backend), f"st-{backend}", "int8", "peer")
                          for backend, name in REMOTE_PEERS.items()]
    if "default" in o.models:
        pick = default_pick(o.models["default"])
        # the default model's work per token is the fp32 graph's: its share is computed on that
        paths.append(BenchPath(f"default ({pick[0]}: Pruner.load('default'), no flags)", "in-process",
                               _sequential(lambda s: s.pruner("default", backend=None)), "fp32", pick[1]))
    paths += [BenchPath(f"onnxruntime{on}-fp32", "in-process", _sequential(lambda s: s.pruner("fp32")), "fp32"),
              BenchPath(f"onnxruntime{on}-fp32, fixed batches of 8 in input order", "in-process",
                        _sequential(lambda s: s.pruner("fp32", batching=fixed)), "fp32", batches="fixed")]
    if "fp16" in o.models:
        paths.append(BenchPath(f"onnxruntime{on}-fp16", "in-process", _sequential(lambda s: s.pruner("fp16"))))
    if int8:
        paths.append(BenchPath("onnxruntime-int8", "in-process", _sequential(lambda s: s.pruner("int8")),
                               "int8", "int8"))
    if o.openvino and o.device == "cpu":
        paths += [BenchPath("openvino-fp32", "in-process", _sequential(lambda s: s.pruner("fp32", backend="openvino")),
                            "fp32"),
                  BenchPath("openvino-bf16", "in-process",
                            _bf16("openvino-bf16", lambda s: s.pruner("fp32", backend="openvino", precision="bf16")),
                            "fp32", "bf16"),
                  BenchPath("openvino-int8 (NNCF static)", "in-process", _sequential(lambda s: s.ov_int8()),
                            "fp32", "int8"),
                  BenchPath("openvino-int8 (NNCF static), bf16 rest", "in-process",
                            _bf16("openvino-int8-bf16", lambda s: s.ov_int8("bf16")), "fp32", "int8")]
    if o.triton:
        if o.replicas > 1:
            paths += [BenchPath(f"{label} {o.replicas} replicas c{c} ({precision})", "triton",
                                _concurrent(_triton_core("grpc", True, model), c))
                      for c in cs for model, label in (("bench", "triton-grpc"), ("bench_text", "triton-text-grpc"))]
        paths += [BenchPath(f"triton-{proto} c{c} ({precision})", "triton", _concurrent(_triton_core(proto), c))
                  for proto in ("grpc", "http") for c in cs]
        paths += [BenchPath(f"triton-text-grpc c{c} ({precision})", "triton", _text_model(c)) for c in cs]
        in_front = _rerank(lambda s: ["--server", s.servers()[0].grpc_url, "--text-model", "bench_text"])
        paths += [BenchPath(f"api-text-grpc c{c} ({precision})", "api", _concurrent(in_front, c)) for c in cs]
    if int8:
        paths += [BenchPath(f"onnxruntime-int8 in-process c{c}", "in-process", _concurrent(_shared("int8"), c))
                  for c in cs]
        args = ["--model", str(o.models["int8"])] + (["--threads", str(o.threads)] if o.threads else [])
        paths += [BenchPath(f"api-in-process c{c} (int8)", "api", _concurrent(_rerank(lambda s: args), c))
                  for c in cs]
    if o.server_url:         # an existing Triton deployment's text model
        paths += [BenchPath(f"deployment-text-grpc c{c}", "deployment",
                            _concurrent(_deployed(o.server_url, o.text_model), c)) for c in cs]
    if o.api_url:            # an existing HTTP API (TEI's /rerank)
        paths += [BenchPath(f"deployment-api c{c}", "deployment", _concurrent(_rerank(url=o.api_url), c))
                  for c in cs]
    return paths


def default_pick(folder: Path) -> tuple[str, str]:
    """(what the default model's export is, the arithmetic its share is computed on): its
    `--precision auto` pick where it has one; "not exported yet" for `--list`."""
    from engine.spec import MANIFEST, Manifest
    if not (Path(folder) / MANIFEST).is_file():
        return "not exported yet", "fp32"
    manifest = Manifest.read(folder)
    picked = manifest.data.get("auto", {}).get("picked") or manifest.precision or "fp32"
    return picked, "int8" if "int8" in picked else "bf16" if "bf16" in picked else "fp32"


def select(paths: list[BenchPath], only: str | None) -> list[BenchPath]:
    """The paths whose name or id `only` matches (all when None); an error when none does."""
    chosen = [p for p in paths if selects(only, p.name)]
    if not chosen:
        raise ValueError(f"no benchmark path matches {only!r}; `prune bench --list` shows them")
    return chosen


def measure(session: Session, paths: list[BenchPath], repeats: int) -> dict[str, PathResult]:
    """Start the paths (a path that cannot run here is logged and left out), then run them
    interleaved over `repeats`; each measured path's result."""
    runners: dict[str, Runner] = {}
    for p in paths:
        session.log(f"starting {p.id} ...")
        runner = p.start(session)
        if runner is None:
            session.log(f"{p.id}: not measured here")
            continue
        runners[p.name] = runner
    n_passages = sum(len(q.passages) for q in session.queries)
    tokens = sum(int(b.attention_mask.sum()) for b in session.batches())
    results = {name: PathResult(name, passages=n_passages, tokens=tokens) for name in runners}

    def timed(name: str) -> Callable[[], float]:
        return lambda: runners[name](results[name])
    for name, seconds in interleave({n: timed(n) for n in runners}, repeats, session.log).items():
        results[name].seconds = seconds
    empty = [n for n, r in results.items() if not r.latencies]
    if empty:
        raise RuntimeError(f"no latencies for {empty}")
    return results


def bench(o: BenchOptions, log=print, out_dir: Path | None = None) -> dict[str, Any]:
    """Measure the selected paths of the registry and return the report (`bench_report`
    writes it). With `server_url`/`api_url` and no `only`, only the deployment's paths
    run (the local model still gives the workload's token counts)."""
    only = o.only if o.only is not None or not (o.server_url or o.api_url) else "^deployment-"
    qs = load_rag_data(o.data, o.queries)
    session = Session(o, qs, log)
    with session.stack:
        fp32 = session.pruner("fp32")
        paths = select(registry(o, fp32.family.name), only)
        results = measure(session, paths, o.repeats)
        pa = None
        if session.started("servers") and out_dir is not None and o.perf:
            log("perf_analyzer ...")
            server = session.servers()[0]
            core = session.pruner("int8" if "int8" in o.models else "fp32")
            pa = {"bench": perf_analyzer(server.grpc_url, "bench", core_input_data(core, qs), o.concurrencies,
                                         out_dir, o.perf_analyzer, o.perf_window_ms),
                  "bench_text": perf_analyzer(server.grpc_url, "bench_text", text_input_data(qs), o.concurrencies,
                                              out_dir, o.perf_analyzer, o.perf_window_ms)}
        return report(session, paths, results, only, pa)


def report(session: Session, paths: list[BenchPath], results: dict[str, PathResult], only: str | None,
           pa: dict[str, Any] | None) -> dict[str, Any]:
    """The report of a measured run (see the module docstring)."""
    from engine.batching import BatchingConfig
    o, qs, log = session.options, session.queries, session.log
    fp32 = session.pruner("fp32")
    sorted_batches = session.batches()
    fixed_batches = workload_batches(session.pruner("fp32", batching=BatchingConfig(strategy="fixed",
                                                                                     max_batch_size=8)), qs)
    n_passages = sum(len(q.passages) for q in qs)
    on = "" if o.device == "cpu" else "-cuda"
    base_name = "torch-unbatched (reference)" if o.checkpoint else f"onnxruntime{on}-fp32"
    base = statistics.median(results[base_name].seconds) if base_name in results else None
    batched_t = statistics.median(results["torch-batched"].seconds) if "torch-batched" in results else None
    rows = [results[p.name].summary(base) | {"group": p.group} for p in paths if p.name in results]
    for row in rows:
        row["speedup_vs_torch_batched"] = (batched_t / row["seconds_median"]) if batched_t else None
    rep: dict[str, Any] = {
        "machine": machine_info(o.device),
        "settings": {"data": str(o.data), "queries": len(qs), "passages": n_passages,
                     "tokens": sum(int(b.attention_mask.sum()) for b in sorted_batches), "device": o.device,
                     "repeats": o.repeats, "threads": o.threads, "models": {k: str(v) for k, v in o.models.items()},
                     "checkpoint": o.checkpoint, "only": only, "text_instances": o.text_instances,
                     "replicas": o.replicas, "server": o.server_url,
                     "text_model": o.text_model if o.server_url else None, "api": o.api_url,
                     "buckets": list(fp32.batching.buckets_for(fp32.spec.max_length)),
                     "max_batch_tokens": fp32.batching.max_batch_tokens},
        "paths": rows,
        "not_measured": [p.id for p in paths if p.name not in results],
        "client": client_share(fp32, qs),
        "padding_share": {"sorted token budget": padding_share(sorted_batches),
                          "fixed batches of 8, input order": padding_share(fixed_batches)},
        "output_size": output_bytes(sorted_batches, n_passages),
        "perf_analyzer": pa,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if o.device == "cpu":
        shapes = {"sorted": [b.input_ids.shape for b in sorted_batches],
                  "fixed": [b.input_ids.shape for b in fixed_batches]}
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
                sent[p.name] = (p.graph, peer.precision,
                                [sh for q in qs for sh in peer.shapes(call_texts(q.question, q.passages)[0])])
            elif p.graph in graphs:
                sent[p.name] = (p.graph, p.precision, shapes[p.batches])
        rep["limits"] = machine_limits(rows, graphs, o.threads, sent, log)
    model_int8 = next((r for r in rows if r["path"] == "onnxruntime-int8"), None)
    if model_int8:
        rep["client"]["share_of_int8_total"] = rep["client"]["client_seconds"] / model_int8["seconds_median"]
    return rep


def machine_limits(rows: list[dict[str, Any]], graphs: dict[str, Path], threads: int | None,
                   sent: dict[str, tuple[str, str, list]], log=print) -> dict[str, Any]:
    """This CPU's fp32 and int8 GEMM rates with ONNX Runtime (and, where an OpenVINO path
    ran, OpenVINO's f32, bf16 and int8 ones), each graph's work per token
    (engine.tools.limits), and every in-process path's achieved rate as a share of the
    machine's rate for its arithmetic (the fastest any runtime reached; `limit_share` in
    its row). `graphs`: an exported model folder (its manifest names the graph) or an ONNX
    file, by name; `sent`: path -> (the graph's name, precision: fp32, bf16 or int8, the
    padded (rows, length) batches the path sent)."""
    try:
        from engine.tools.limits import gemm_rates, graph_work, openvino_gemm_rates, workload_flops
        rates = gemm_rates(threads)
    except ImportError as exc:     # onnx (the [export] extra) builds the GEMM graphs
        return {"skipped": f"needs {exc.name} (pip install 'prune-engine[export]')"}
    keys = {"fp32": "fp32_gflops", "bf16": "bf16_gflops", "int8": "int8_gops"}
    limits = {kind: (rates[key], "onnxruntime") for kind, key in keys.items() if key in rates}
    if any(path.startswith("openvino") for path in sent):
        rates["openvino"] = openvino_gemm_rates(threads)
        for kind, key in keys.items():
            if key in rates["openvino"] and rates["openvino"][key] > limits.get(kind, (0.0, ""))[0]:
                limits[kind] = (rates["openvino"][key], "openvino")
    log("GEMM limit: " + ", ".join(f"{kind} {rate:.0f} G/s ({runtime})" for kind, (rate, runtime) in limits.items()))
    rates["limits"] = {kind: {"rate": rate, "runtime": runtime} for kind, (rate, runtime) in limits.items()}
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
        if precision not in limits:
            continue
        limit, runtime = limits[precision]
        row.update(achieved_gflops=rate, limit_share=rate / limit,
                   limit=f"{precision} GEMM {limit:.0f} G/s ({runtime})")
    return out
