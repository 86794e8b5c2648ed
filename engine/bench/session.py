"""What one run of `prune bench` is made of (engine.bench.registry runs it): its options
(`BenchOptions`), a path of the registry (`BenchPath`), and the `Session` the selected
paths share while they run: Pruners, tritonservers, `prune api` processes, the peers'
exports, each started on first use and closed at the end.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.bench.runs import PathResult, Stop, path_id, start_api

Runner = Callable[[PathResult], float]  # runs the workload once; its seconds
PEERS = {
    "fastembed-fp32": "peer: fastembed (ONNX Runtime fp32, plain export; embed + cosine, no decisions)",
    "fastembed-int8": "peer: fastembed (ONNX Runtime int8 dynamic, per-tensor weights; embed + cosine, "
    "no decisions)",
    "sentence-transformers": "peer: sentence-transformers (torch fp32; encode + cosine, no decisions)",
}
#: why the torch.compile path waits for --compile-backend on the CPU (measured on this project's 2-core
#: machines, the 2-layer test checkpoint, torch 2.13: inductor's first compile 35 s, 12-15 s for each new shape)
COMPILE_ON_CPU = (
    "on the CPU, inductor compiles C++ for each batch shape (35 s for the first, 12-15 s for each "
    "further one, on a 2-layer test model with 2 cores): this path is measured with --device cuda, "
    "or here when --compile-backend names a backend (inductor, or aot_eager: a trace without code "
    "generation)"
)


@dataclass(frozen=True)
class BenchOptions:
    """What `prune bench` measures: the models, the workload and which paths."""

    models: dict[str, Path]  # "fp32" or "fp16" (one at least), "int8": exported folders
    data: Path
    checkpoint: str | None = None  # the PyTorch reference paths and the peers
    queries: int = 30
    repeats: int = 3
    threads: int | None = None
    triton: bool = False
    concurrencies: tuple[int, ...] = (1, 4, 16)
    only: str | None = None  # a regular expression on names and ids
    text_instances: int = 4
    perf: bool = True
    perf_analyzer: str | None = None  # the binary (default: beside the interpreter, then PATH)
    perf_window_ms: int = 8000  # each of perf_analyzer's measurement windows
    replicas: int = 1
    device: str = "cpu"
    server_url: str | None = None
    text_model: str = "default_text"
    api_url: str | None = None
    openvino: bool = False  # OpenVINO fp32, bf16 (where the CPU has it) and static INT8
    serving: bool = False  # prune api unmerged against merged at each concurrency (always with INT8 on a CPU)
    peer_python: str | None = None  # an interpreter with sentence-transformers[onnx,openvino]
    budget_s: float | None = None  # stop measuring after this many seconds (what was measured is kept)
    compile_backend: str | None = None  # torch.compile's backend (None: inductor; on the CPU, not run)

    def __post_init__(self):
        if not {"fp32", "fp16"} & set(self.models):
            raise ValueError("prune bench needs an fp32 (--model) or fp16 (--fp16) export")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and self.triton:
            raise ValueError(
                "--triton serves the CPU repository: on a GPU, build one with prune repository "
                "--target gpu and serve it in NVIDIA's container (docs/triton.md)"
            )
        if self.repeats < 1 or self.queries < 1:
            raise ValueError("--repeats and --queries must be at least 1")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError("--budget-s must be positive")

    @property
    def base(self) -> str:
        """The export that counts the workload's tokens and batches: fp32, else fp16."""
        return "fp32" if "fp32" in self.models else "fp16"


@dataclass
class BenchPath:
    """One path of the registry: its display name, group, how to start it, and which
    graph, precision and batches its share of the machine's GEMM rate is computed on."""

    name: str
    group: str
    start: Callable[["Session"], Runner | None]  # None: not measurable here (logged why)
    graph: str | None = None  # a models key or a peer's id
    precision: str = "fp32"
    batches: str = "sorted"  # "sorted", "fixed" or "peer"

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
    stop: Stop = field(default_factory=Stop)
    reasons: dict[str, str] = field(default_factory=dict)  # why a path was not measured, by name
    warmups: dict[str, float] = field(default_factory=dict)  # a GPU path's untimed first pass, seconds
    starting: str | None = None  # the path being started
    _cache: dict[Any, Any] = field(default_factory=dict)

    def not_here(self, reason: str) -> None:
        """What a path's `start` returns when it cannot run here: the reason, logged and
        kept for the report."""
        name = self.starting or "?"
        self.reasons[name] = reason
        self.log(f"{name}: not measured: {reason}")
        return None

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
        return self.once(
            ("pruner", model, tuple(sorted(kw.items()))),
            lambda: Pruner.load(o.models[model], threads=o.threads, device=device, **kw),
        )

    def ov_int8(self, precision: str = "fp32") -> Any:
        """The static INT8 OpenVINO export: `models["ov-int8"]`, else made here from the fp32
        export (NNCF, its default settings; it lives until the end); what it keeps float
        computed at `precision` (fp32, or bf16 where the CPU has it)."""
        from engine.pruner import Pruner

        o = self.options

        def make():
            folder = o.models.get("ov-int8")
            if folder is None:
                from export.ov_int8 import quantize

                folder = (
                    Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-ov-")))
                    / "m"
                )
                self.log("openvino-int8: quantizing the fp32 export with NNCF ...")
                quantize(o.models["fp32"], folder, log=lambda m: None)
            return folder

        folder = self.once("ov-int8", make)
        return self.once(
            ("ov-int8", precision),
            lambda: Pruner.load(folder, backend="openvino", precision=precision, threads=o.threads),
        )

    def torch(self, **kw) -> Any:
        """The checkpoint through the PyTorch reference backend."""
        from engine.pruner import Pruner

        o = self.options
        return self.once(
            ("torch", tuple(sorted(kw.items()))),
            lambda: Pruner.load(o.checkpoint, backend="torch", threads=o.threads, device=o.device, **kw),
        )

    def compiled(self, dtype: str) -> tuple[Any, float]:
        """The checkpoint through PyTorch at `dtype`, its module under torch.compile (the
        options' backend, inductor by default; dynamic shapes: the workload's batches come
        in many), and the seconds of a first, untimed pass over the workload, in which it
        compiles: (pruner, seconds)."""
        o = self.options

        def make():
            import torch

            from engine.pruner import Pruner

            pruner = Pruner.load(
                o.checkpoint, backend="torch", threads=o.threads, device=o.device, dtype=dtype
            )
            pruner.backend.model = torch.compile(
                pruner.backend.model, backend=o.compile_backend or "inductor", dynamic=True
            )
            t0 = time.perf_counter()
            for q in self.queries:
                self.stop.check()
                pruner.prune(q.question, q.passages)
            seconds = time.perf_counter() - t0
            self.log(f"torch.compile {dtype}: first pass over the workload, compiling, {seconds:.1f} s")
            return pruner, seconds

        return self.once(("compiled", dtype), make)

    def servers(self) -> list:
        """The local tritonservers (`--replicas` of them) on the bench repository."""
        return self.once("servers", self._start_servers)

    def _start_servers(self) -> list:
        import socket

        from engine.triton.server import TritonServer
        from export.triton_repository import RepositoryOptions, build_repository

        o = self.options
        repo = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-repo-")))
        build_repository(
            o.models.get("int8", o.models[o.base]),
            repo,
            RepositoryOptions(
                target="cpu",
                name="bench",
                max_batch_size=64,
                intra_op_threads=o.threads or 0,
                text_instances=o.text_instances,
            ),
            log=lambda m: None,
        )
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
        from engine.bench.peers import embedding_peers

        o = self.options

        def make():
            folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-peers-")))
            by_name = embedding_peers(o.checkpoint, folder, o.device, o.threads, self.log)
            return {pid: by_name[name] for pid, name in PEERS.items() if name in by_name}

        return self.once("peers", make)

    def remote_peer(self, backend: str) -> Any:
        """sentence-transformers' `backend` (onnx, openvino) in `peer_python`'s environment,
        its export in a folder that lives until the end, its worker closed at the end."""
        from engine.bench.peers import remote_peers

        o = self.options

        def make():
            folder = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="prune-bench-st-")))
            ((peer, worker),) = remote_peers(
                o.peer_python, o.checkpoint, folder, self.log, (backend,)
            ).values()
            self.stack.callback(worker.close)
            return peer

        return self.once(("remote-peer", backend), make)
