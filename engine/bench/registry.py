"""`prune bench`: the speed of every path, side by side, on a RAG workload.

Built in three parts:

- **the registry** (`registry`, here): every path the options make possible, each a
  `BenchPath` with a stable id, a group and a `start` that builds what it needs (a Pruner,
  a tritonserver, a `prune api` process) only when the path is selected, from the
  `Session` the paths share (engine.bench.session, beside `BenchOptions`);
- **the runner** (`measure`, engine.bench.runner): starts the selected paths, then runs them interleaved
  over the repeats (every path once a round, as `engine.machine.timing.interleave` does) so that
  drift hits them alike (on a GPU, each path first runs the workload once, untimed:
  sessions per shape, CUDA graphs and compiles are made there); it stops early when its
  budget (`--budget-s`) is spent or
  SIGTERM comes, keeping every repeat that ended (under a budget the engine's paths start
  first, and each path's first repeat runs as soon as it has started), and a path that
  cannot start or fails is listed as not measured with the reason, not a crash;
- **the report** (engine.bench.figures): medians, latencies, the machine, the
  batching ablation, the client's share, bytes per passage, perf_analyzer and each path's
  share of this machine's GEMM rate (`bench_report` writes it as markdown and a chart).

Each query of the data (a question and its passages) is one call of the full pipeline:
sentence splitting, tokenization, model, decisions. The groups:

- reference: `torch-unbatched (reference)` (the fp32 PyTorch module one passage per
  forward, as users run Provence today: the ratios' baseline), `torch-batched` (fp32,
  and fp16 on a GPU), and `torch.compile batched` (the same module under torch.compile,
  fp16 on a GPU, through the engine's pipeline and token budget: the compiler's peer on
  the same calls; its first pass, where it compiles, is counted apart);
- peer: fastembed fp32/int8 and sentence-transformers on the same checkpoint (embedding
  family);
- in-process: the exported graphs through ONNX Runtime, the batching ablation (fixed
  batches of 8 in input order), and INT8 shared by 1/4/16 client threads;
- triton (`--triton`): the CPU repository under a local tritonserver over gRPC and HTTP,
  its text model, the HTTP API in front of it, and with `--replicas N` one client over N
  servers; perf_analyzer on the core and the text model;
- api: `prune api --model` on the INT8 folder, TEI's /rerank;
- deployment (`--server`, `--api`): an existing deployment's text model and HTTP API.

An LLMLingua-2 `--checkpoint` runs the compressor's paths instead (group "compressor",
engine.bench.lingua: llmlingua's PromptCompressor against the engine on the same prompts).

Timings are never asserted in tests; they are printed with the machine and settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from engine.bench.session import COMPILE_ON_CPU, PEERS, BenchOptions, BenchPath, Runner, Session
from engine.bench.runs import (
    PathResult,
    RerankClient,
    SharedPruner,
    run_concurrent,
    run_sequential,
    selects,
)

GROUPS = ("reference", "peer", "in-process", "triton", "api", "deployment")


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
            return s.not_here(f"{pid} does not run here (the log says why)")
        return lambda r: run_sequential(peer, s.queries, r)

    return start


def _compiled(dtype: str):
    """The torch.compile path: its compile time (a first pass over the workload) is kept
    in its row as `compile_s`, apart from the timed repeats."""

    def start(s: Session) -> Runner | None:
        if s.options.device == "cpu" and s.options.compile_backend is None:
            return s.not_here(COMPILE_ON_CPU)
        pruner, seconds = s.compiled(dtype)

        def run(r: PathResult) -> float:
            r.extra["compile_s"] = seconds
            return run_sequential(pruner, s.queries, r)

        return run

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
        from engine.machine.cpu import BF16_MISSING

        if not bf16_supported():
            return s.not_here(BF16_MISSING)
        return _sequential(make)(s)

    return start


def _triton_core(proto: str, replicas: bool = False, model: str = "bench"):
    def client_of(s: Session) -> Callable[[], Any]:
        from engine.pruner import Pruner

        if replicas:  # one multi-endpoint client over every replica
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


def _serving_paths(o: BenchOptions, int8: bool) -> list[BenchPath]:
    """`prune api --model` serving 1, 4 and 16 concurrent callers (--concurrencies) of TEI's /rerank:
    unmerged (--merge-calls off, the workers' default: 1 on a CPU, 16 on a GPU) against concurrent
    calls merged (--merge-calls on, 16 workers), on the export the device serves: INT8 on a CPU where
    given, else fp32; fp16 on a GPU."""
    if not (int8 or o.serving):
        return []
    model = "fp16" if o.device == "cuda" and "fp16" in o.models else "int8" if int8 else o.base
    base = ["--model", str(o.models[model])] + (["--threads", str(o.threads)] if o.threads else [])
    base += ["--device", o.device]
    merged = base + ["--merge-calls", "on", "--workers", "16"]
    unmerged = base + ["--merge-calls", "off"]
    return [
        BenchPath(f"api-in-process c{c}{how} ({model})", "api", _concurrent(_rerank(lambda s, a=args: a), c))
        for c in o.concurrencies
        for how, args in (("", unmerged), (" merged", merged))
    ]


def registry(o: BenchOptions, family: str) -> list[BenchPath]:
    """Every path these options make possible, in report order; nothing is started."""
    int8 = "int8" in o.models and o.device == "cpu"
    return [*_reference_paths(o, family), *_in_process_paths(o, int8), *_served_paths(o, int8)]


def _reference_paths(o: BenchOptions, family: str) -> list[BenchPath]:
    """PyTorch on the checkpoint, and the peers on the embedding family's job."""
    from engine.pipeline.encode import BatchingConfig

    if not o.checkpoint:
        return []
    unbatched = BatchingConfig(max_batch_size=1, strategy="fixed")
    paths = [
        BenchPath(
            "torch-unbatched (reference)",
            "reference",
            _sequential(lambda s: s.torch(batching=unbatched), per_passage=True),
        ),
        BenchPath("torch-batched", "reference", _sequential(lambda s: s.torch()), "fp32"),
    ]
    if o.device == "cuda":
        paths.append(
            BenchPath("torch-batched fp16", "reference", _sequential(lambda s: s.torch(dtype="float16")))
        )
    paths.append(
        BenchPath(
            "torch.compile batched" + (" fp16" if o.device == "cuda" else ""),
            "reference",
            _compiled("float16" if o.device == "cuda" else "float32"),
        )
    )
    if family == "embedding":
        paths += [
            BenchPath(name, "peer", _peer(pid), pid, "int8" if pid.endswith("int8") else "fp32", "peer")
            for pid, name in PEERS.items()
        ]
        if o.peer_python:
            from engine.bench.peers import REMOTE_PEERS

            paths += [
                BenchPath(name, "peer", _remote_peer(backend), f"st-{backend}", "int8", "peer")
                for backend, name in REMOTE_PEERS.items()
            ]
    return paths


def _in_process_paths(o: BenchOptions, int8: bool) -> list[BenchPath]:
    """The exports in this process: the default model, ONNX Runtime's precisions (and the
    batching ablation), OpenVINO's."""
    from engine.pipeline.encode import BatchingConfig

    on = "" if o.device == "cpu" else "-cuda"
    fixed = BatchingConfig(strategy="fixed", max_batch_size=8)
    paths: list[BenchPath] = []
    if "default" in o.models:
        pick = default_pick(o.models["default"])
        # the default model's work per token is the fp32 graph's: its share is computed on that
        paths.append(
            BenchPath(
                f"default ({pick[0]}: Pruner.load('default'), no flags)",
                "in-process",
                _sequential(lambda s: s.pruner("default", backend=None)),
                "fp32",
                pick[1],
            )
        )
    if "fp32" in o.models:
        paths += [
            BenchPath(f"onnxruntime{on}-fp32", "in-process", _sequential(lambda s: s.pruner("fp32")), "fp32"),
            BenchPath(
                f"onnxruntime{on}-fp32, fixed batches of 8 in input order",
                "in-process",
                _sequential(lambda s: s.pruner("fp32", batching=fixed)),
                "fp32",
                batches="fixed",
            ),
        ]
    if "fp16" in o.models:
        paths.append(
            BenchPath(f"onnxruntime{on}-fp16", "in-process", _sequential(lambda s: s.pruner("fp16")))
        )
    if int8:
        paths.append(
            BenchPath(
                "onnxruntime-int8", "in-process", _sequential(lambda s: s.pruner("int8")), "int8", "int8"
            )
        )
    if o.openvino and o.device == "cpu" and "fp32" in o.models:
        paths += [
            BenchPath(
                "openvino-fp32",
                "in-process",
                _sequential(lambda s: s.pruner("fp32", backend="openvino")),
                "fp32",
            ),
            BenchPath(
                "openvino-bf16",
                "in-process",
                _bf16("openvino-bf16", lambda s: s.pruner("fp32", backend="openvino", precision="bf16")),
                "fp32",
                "bf16",
            ),
            BenchPath(
                "openvino-int8 (NNCF static)",
                "in-process",
                _sequential(lambda s: s.ov_int8()),
                "fp32",
                "int8",
            ),
            BenchPath(
                "openvino-int8 (NNCF static), bf16 rest",
                "in-process",
                _bf16("openvino-int8-bf16", lambda s: s.ov_int8("bf16")),
                "fp32",
                "int8",
            ),
        ]
    return paths


def _served_paths(o: BenchOptions, int8: bool) -> list[BenchPath]:
    """What runs behind a server: Triton, the HTTP API, INT8 shared by client threads, and an
    existing deployment."""
    cs = o.concurrencies
    precision = "int8" if "int8" in o.models else "fp32"
    paths: list[BenchPath] = []
    if o.triton:
        if o.replicas > 1:
            paths += [
                BenchPath(
                    f"{label} {o.replicas} replicas c{c} ({precision})",
                    "triton",
                    _concurrent(_triton_core("grpc", True, model), c),
                )
                for c in cs
                for model, label in (("bench", "triton-grpc"), ("bench_text", "triton-text-grpc"))
            ]
        paths += [
            BenchPath(f"triton-{proto} c{c} ({precision})", "triton", _concurrent(_triton_core(proto), c))
            for proto in ("grpc", "http")
            for c in cs
        ]
        paths += [BenchPath(f"triton-text-grpc c{c} ({precision})", "triton", _text_model(c)) for c in cs]
        in_front = _rerank(lambda s: ["--server", s.servers()[0].grpc_url, "--text-model", "bench_text"])
        paths += [BenchPath(f"api-text-grpc c{c} ({precision})", "api", _concurrent(in_front, c)) for c in cs]
    if int8:
        paths += [
            BenchPath(f"onnxruntime-int8 in-process c{c}", "in-process", _concurrent(_shared("int8"), c))
            for c in cs
        ]
    paths += _serving_paths(o, int8)
    if o.server_url:  # an existing Triton deployment's text model
        paths += [
            BenchPath(
                f"deployment-text-grpc c{c}",
                "deployment",
                _concurrent(_deployed(o.server_url, o.text_model), c),
            )
            for c in cs
        ]
    if o.api_url:  # an existing HTTP API (TEI's /rerank)
        paths += [
            BenchPath(f"deployment-api c{c}", "deployment", _concurrent(_rerank(url=o.api_url), c))
            for c in cs
        ]
    return paths


def default_pick(folder: Path) -> tuple[str, str]:
    """(what the default model's export is, the arithmetic its share is computed on): its
    `--precision auto` pick where it has one; "not exported yet" for `--list`."""
    from engine.pipeline.spec import MANIFEST, Manifest

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
