"""The measuring parts of `prune bench` (engine.bench.registry): a path's timings, when a run
stops early (its budget, SIGTERM), sequential and concurrent runs, the HTTP API as a
process, the client's share of the work, padding, and Triton's perf_analyzer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.measuring import call_batches, workload_batches


@dataclass
class PathResult:
    """One measured path: its passages/s over repeats, latency and what it ran."""

    name: str
    seconds: list[float] = field(default_factory=list)  # per repeat, whole workload
    latencies: list[float] = field(default_factory=list)  # per query, last repeat
    passages: int = 0
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # per-path counters (last repeat)

    def summary(self, baseline: float | None) -> dict[str, Any]:
        """The path's row: medians, spread and its speed against `baseline`."""
        t = statistics.median(self.seconds)
        lat = np.array(self.latencies) * 1000
        return {
            "path": self.name,
            "id": path_id(self.name),
            "seconds_median": t,
            "seconds": self.seconds,
            "passages_per_s": self.passages / t,
            "tokens_per_s": self.tokens / t,
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "speedup_vs_reference": (baseline / t) if baseline else None,
            "repeats": len(self.seconds),
            **self.extra,
        }


class BenchStopped(Exception):
    """`prune bench` stopped before its end: its budget was spent, or a signal came."""


class Stop:
    """When a `prune bench` run stops early: `budget_s` seconds after it began, or at
    SIGTERM (a `timeout` around it). `check()` raises BenchStopped once either has come;
    while `armed` (measuring), SIGTERM raises it at once, so a long repeat is cut short;
    unarmed (writing the report), SIGTERM is only recorded and the report is still written."""

    def __init__(self, budget_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.budget_s, self.clock = budget_s, clock
        self.began = clock()
        self.reason: str | None = None
        self.armed = False

    def elapsed(self) -> float:
        """Seconds since the run began."""
        return self.clock() - self.began

    def check(self) -> None:
        """BenchStopped when the budget is spent or a signal came."""
        if self.reason is None and self.budget_s is not None and self.elapsed() >= self.budget_s:
            self.reason = f"its budget of {self.budget_s:g} s was spent"
        if self.reason is not None:
            raise BenchStopped(self.reason)

    def signalled(self, signum: int, frame: Any = None) -> None:
        """The SIGTERM handler: records the stop; raises BenchStopped while armed."""
        if self.reason is None:
            self.reason = signal.Signals(signum).name
        if self.armed:
            self.armed = False
            raise BenchStopped(self.reason)

    @contextlib.contextmanager
    def on_signals(self):
        """SIGTERM handled by `signalled` while inside (where this is the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = signal.signal(signal.SIGTERM, self.signalled)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, old)

    @contextlib.contextmanager
    def measuring(self):
        """Armed while inside: a SIGTERM then stops the work at once."""
        self.armed = True
        try:
            yield self
        finally:
            self.armed = False


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
    ready.wait()  # clients are connected; time only the work
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    el = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    res.latencies = lat
    return el


class SharedPruner:
    """One pruner handed to every client thread of run_concurrent (which closes each
    thread's client): closing it is its owner's business."""

    def __init__(self, pruner):
        self.prune = pruner.prune

    def close(self) -> None:
        """Nothing: the pruner's owner closes it."""


class RerankClient:
    """A client of the HTTP API's TEI /rerank on one keep-alive connection (the stdlib's,
    so the bench needs nothing the API's users would not have)."""

    def __init__(self, url: str):
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)

    def prune(self, question: str, passages: list[str]) -> list[dict[str, Any]]:
        """One /rerank call; its ranked results."""
        self._conn.request(
            "POST",
            "/rerank",
            body=json.dumps({"query": question, "texts": passages}),
            headers={"Content-Type": "application/json"},
        )
        r = self._conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"/rerank answered {r.status}: {body[:300]!r}")
        out = json.loads(body)
        if len(out) != len(passages):
            raise RuntimeError(f"/rerank returned {len(out)} results for {len(passages)} texts")
        return out

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def path_id(name: str) -> str:
    """A path's id: its name in lower case, every run of other characters one '-'
    ("triton-text-grpc c16 (int8)" -> "triton-text-grpc-c16-int8"); stable across
    reports, safe in a shell and a file name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def selects(only: str | None, name: str) -> bool:
    """Whether --paths (a regular expression) keeps the path `name`: it matches the
    path's name or its id."""
    return not only or bool(re.search(only, name) or re.search(only, path_id(name)))


def start_api(args: list[str], log=print, timeout: float = 300.0) -> tuple[subprocess.Popen, str]:
    """`prune api ARGS` as its own process (its own interpreter, as deployed) on a free
    loopback port; returns it and its URL once /health answers."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "api", "--quiet", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    from engine.pipeline.decide import build_result, keep_mask
    from engine.pipeline.text import split_sentences

    fam = pruner.family
    t0 = time.perf_counter()
    n = 0
    for q in queries:
        spans = [split_sentences(p) for p in q.passages]
        call_batches(pruner, q.question, q.passages, spans)
        for p, sp in zip(q.passages, spans):
            probs = np.full(len(sp), 0.5)
            build_result(
                0,
                p,
                sp,
                probs,
                keep_mask(probs, fam, fam.rules.threshold, fam.rules.title, fam.rules.alpha),
                0.0,
                fam.rules.threshold,
                1,
            )
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
    return {
        "pooled_bytes_per_passage": pooled / n_passages,
        "raw_token_bytes_per_passage": raw / n_passages,
        "reduction": raw / pooled if pooled else 0.0,
    }


def core_input_data(pruner, queries) -> list[dict[str, Any]]:
    """perf_analyzer input data for the core model: one real block of the workload per request."""
    data = []
    for b in workload_batches(pruner, queries[:20]):
        for r in range(b.shape[0]):
            data.append(
                {
                    n: {"content": getattr(b, n)[r].tolist(), "shape": [b.shape[1]]}
                    for n in pruner.spec.input_names
                }
            )
    return data


def text_input_data(queries) -> list[dict[str, Any]]:
    """perf_analyzer input data for the text model: one query (question and passages) per request."""
    return [
        {
            "question": {"content": [q.question], "shape": [1]},
            "passages": {"content": list(q.passages), "shape": [len(q.passages)]},
        }
        for q in queries[:20]
    ]


#: Triton's release: the server nvidia-pytriton 0.7.0 bundles ([serve]), the image deploy/Dockerfile
#: starts from (24.10), and the tritonclient wheel whose perf_analyzer binary matches it
TRITON_RELEASE = "2.51.0"


def find_perf_analyzer(binary: str | None = None) -> Path | str:
    """perf_analyzer's binary: `binary`, else beside this interpreter, else on PATH; or a
    sentence saying why there is none."""
    import shutil

    if binary:
        return Path(binary) if Path(binary).is_file() else f"--perf-analyzer {binary}: no such file"
    beside = Path(sys.executable).parent / "perf_analyzer"
    found = beside if beside.is_file() else shutil.which("perf_analyzer")
    if found:
        return Path(found)
    return (
        f"no perf_analyzer binary: install one with `pip install --no-deps --target DIR "
        f"tritonclient=={TRITON_RELEASE} nvidia-cuda-runtime-cu12` and pass --perf-analyzer "
        "DIR/bin/perf_analyzer (docs/installing.md)"
    )


def perf_analyzer(
    server_grpc: str,
    model: str,
    data: list[dict[str, Any]],
    concurrencies,
    out_dir: Path,
    binary: str | None = None,
    window_ms: int = 8000,
) -> dict[str, Any]:
    """Triton's perf_analyzer on real requests of the workload (its JSON input data).
    `binary`: its path (default: beside this interpreter, then on PATH; docs/installing.md);
    `window_ms`: each measurement window (it takes 3 to 6 of them, until they agree)."""
    found = find_perf_analyzer(binary)
    if isinstance(found, str):
        return {"skipped": found}
    binary = found
    data_file = out_dir / f"perf_analyzer_input_{model}.json"
    data_file.write_text(json.dumps({"data": data}))
    env = dict(os.environ)
    libs = [binary.parent.parent / "nvidia" / "cuda_runtime" / "lib"]  # installed with --target beside it
    try:
        import nvidia.cuda_runtime

        libs.append(Path(nvidia.cuda_runtime.__path__[0]) / "lib")
    except ImportError:
        pass
    env["LD_LIBRARY_PATH"] = ":".join([str(d) for d in libs if d.is_dir()] + [env.get("LD_LIBRARY_PATH", "")])
    results = {}
    for c in concurrencies:
        csv = out_dir / f"perf_analyzer_{model}_c{c}.csv"
        # a shared 2-core machine is noisy: longer windows and a looser stability band
        cmd = [
            str(binary),
            "-m",
            model,
            "-u",
            server_grpc,
            "-i",
            "grpc",
            "--input-data",
            str(data_file),
            "--concurrency-range",
            f"{c}:{c}",
            "--measurement-interval",
            str(window_ms),
            "-f",
            str(csv),
            "--percentile",
            "95",
            "--stability-percentage",
            "50",
            "--max-trials",
            "6",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
        if proc.returncode != 0:
            return {"skipped": f"perf_analyzer failed: {(proc.stderr or proc.stdout)[-400:]}"}
        rows = [line.split(",") for line in csv.read_text().splitlines()]
        head, vals = rows[0], rows[1]
        rec = dict(zip(head, vals))
        results[str(c)] = {k: float(v) for k, v in rec.items() if v.replace(".", "", 1).isdigit()}
    return results
