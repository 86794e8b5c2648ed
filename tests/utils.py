"""What the tests share besides fixtures (tests/conftest.py holds those): the families,
the data folder, the shared repository's limits, the parity texts, and helpers for
windows, ports, processes and the HTTP API. Test modules import from here, never from
conftest or from each other."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import types
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.gpu_memory import DeviceMemory
from engine.pipeline.encode import ModelBatch
from engine.pipeline.families import FAMILIES

#: every family of the engine's table (engine.pipeline.families.FAMILIES), in its order: a family
#: added there gets its test checkpoint and every per-family test without a change here
FAMILY_NAMES = list(FAMILIES)
#: the fp16 GPU graphs' exports (conftest.gpu_exports): every family, and OpenProvence on ModernBERT
GPU_FAMILIES = FAMILY_NAMES + ["open_provence-modernbert"]

#: Intra-op threads of a real model a test runs in-process: one under pytest-xdist's workers
#: (the README's `-n auto` runs a worker per core and one more, and ONNX Runtime's spinning threads on a
#: core the other worker is using slowed a test four-fold), else every core. What the tests
#: start (the CLI, the API) reads PRUNE_INTRA_OP_THREADS, which tests/conftest.py sets alike.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else None

#: the small data the tests need, carried by the repository (tests/data/README.md: sources, licence, canary)
DATA = Path(__file__).resolve().parent / "data"

#: The shared test repository: small core batches (calls get split) and small text-model
#: limits (calls get chunked), so those paths run on tiny inputs.
CORE_MAX_BATCH = 16
TEXT_MAX_PASSAGES = 50
TEXT_MAX_CHARS = 60_000


#: The texts the parity tests (and the precision, Triton and hardening tests) run
QUESTION = "What goes on the bottom of the pie?"
PASSAGES = [
    "Shepherd's pie. In early cookery books, the dish was a means of using leftover roasted meat. "
    "The pie dish was lined on the sides and bottom with mashed potato, as well as having a crust on top.",
    "Paris is the capital of France.",
    "北京是中国的首都。上海是一个大城市！The museum opened a new exhibition about ancient Egypt.",
    " ".join(
        f"Sentence {i} is about the price of {i}.50 dollars in 2020, said Dr. Smith." for i in range(45)
    ),
    "one single sentence without any punctuation " * 60,  # longer than a window: pieces
    "Short.",
]


class Preceded:
    """A pruner that calls `before()` (a wait, a sleep, a raise) at the start of each
    `prune`, then `base`'s; everything else is `base`'s."""

    def __init__(self, base, before):
        self._base, self._before = base, before

    def __getattr__(self, name):
        return getattr(self._base, name)

    def prune(self, *args, **kwargs):
        self._before()
        return self._base.prune(*args, **kwargs)


def started_threads(target, n: int) -> list[threading.Thread]:
    """n threads running `target()`, started (join them yourself)."""
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def run_in_threads(target, n: int, join_s: float | None = 60) -> None:
    """`target(k)` for k in range(n), each in a thread of its own, all started before any is
    joined (for `join_s` seconds each; None: until it ends). The callers collect their own
    errors: a thread's exception is not raised here."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)


def load_test(connect, call, clients: int, seconds: float = 3.0, per_client: int = 200) -> tuple[list, list]:
    """`clients` threads, client k calls `call(pruner, k, n)` for n = 0, 1, ... on its own
    `connect(k)` until `seconds` pass or it made `per_client` calls. What the calls returned
    and the repr of each exception they raised (a check that fails raises)."""
    done, errors = [], []
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        pruner = connect(k)
        n = 0
        while time.monotonic() < stop and n < per_client:
            try:
                done.append(call(pruner, k, n))
            except Exception as exc:  # noqa: BLE001 (returned to the test, which asserts on it)
                errors.append(repr(exc))
            n += 1

    run_in_threads(client, clients, join_s=30)
    return done, errors


def with_window(pruner, max_length: int, **batching):
    """The same model and backend with a smaller window (forces multi-block passages)."""
    from engine.pipeline.encode import BatchingConfig
    from engine.pruner import Pruner

    spec = dataclasses.replace(pruner.spec, max_length=max_length)
    return Pruner(
        pruner.backend,
        pruner.encoder.tokenizer,
        spec,
        BatchingConfig(**batching) if batching else None,
        min_context_tokens=16,
    )


def processes_under(path) -> dict[int, str]:
    """pid -> command line of every process (but this one) that names `path`: a
    tritonserver serving a repository there, or its python-backend stubs."""
    import re

    me, out = os.getpid(), {}
    needle = re.compile(re.escape(str(path)) + r"(?=/|\s|$)")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")),
                "",
            )
        except OSError:
            continue
        if needle.search(cmd) and "zombie" not in state:
            out[int(entry.name)] = cmd
    return out


def free_ports(n):
    """n free loopback ports (a server started right after binds them)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def fresh_venv(path: Path, *requirements: str, with_pip: bool = False, timeout: int = 900) -> Path:
    """A new venv at `path` with `requirements` installed from the package index, as a user's
    `pip install` resolves them; its python. This environment's pip installs into it (`pip
    --python`), without bytecode (`--no-compile`: compiling took two thirds of torch's
    install); `with_pip` puts a pip inside too, for what runs `python -m pip` in it."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "venv", str(path)] + ([] if with_pip else ["--without-pip"])
    subprocess.run(cmd, check=True, timeout=120)
    python = path / "bin" / "python"
    if requirements:
        pip = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-compile",
                *requirements,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert pip.returncode == 0, pip.stderr[-3000:]
    return python


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name` after `build(folder)` has filled it, once per test run. In one
    process: a new temporary folder. Under pytest-xdist workers: a folder in the run's
    shared temporary folder, built by the first worker that asks while the others wait on
    a file lock, so the workers do not each export the same models. What is built so is
    only read by the tests, as every session fixture's folder is."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    import shutil

    from filelock import FileLock

    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@contextlib.contextmanager
def serve_api(pruner, config=None, embedder=None, log=None):
    """The app on a free loopback port, in a thread; yields its base URL (`log`: the app's notes)."""
    from engine.http.app import ApiConfig, create_app
    from engine.http.api_thread import ApiThread

    (port,) = free_ports(1)
    with ApiThread(create_app(pruner, config or ApiConfig(), embedder, log=log), port=port) as api:
        yield api.url


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_within(pid: int, seconds: float, window: float = 0.5) -> float | None:
    """Seconds until process `pid` spends (almost) no CPU for `window` seconds, or None if it
    keeps working for `seconds`."""
    t0 = time.monotonic()
    last = cpu_seconds(pid)
    while time.monotonic() - t0 < seconds:
        time.sleep(window)
        now = cpu_seconds(pid)
        if now - last < 0.1 * window:
            return time.monotonic() - t0
        last = now
    return None


TINY_DOCS = [
    (
        "When was the stadium built?",
        "The stadium was built in 1923. It holds 80,000 people. Football is played.",
        0,
    ),
    ("Where is Paris?", "Cheese is made from milk. Paris is the capital of France. The Alps are high.", 1),
    ("Who wrote the book?", "The book was written by Jane Austen. It was published in 1813.", 0),
]


def write_tiny_data(root: Path) -> Path:
    """`root/prune.jsonl` (each of TINY_DOCS, its gold sentence labelled) and `root/rag.jsonl`
    (each question with all three passages); `root`."""
    import json

    from engine.pipeline.text import split_sentences

    prune_rows, rag_rows = [], []
    for i, (q, ctx, gold) in enumerate(TINY_DOCS):
        spans = split_sentences(ctx)
        prune_rows.append(
            {
                "id": f"d{i}",
                "question": q,
                "context": ctx,
                "sentences": [list(s) for s in spans],
                "labels": [int(k == gold) for k in range(len(spans))],
            }
        )
        rag_rows.append({"id": f"q{i}", "question": q, "passages": [c for _, c, _ in TINY_DOCS], "gold": i})
    (root / "prune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prune_rows))
    (root / "rag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rag_rows))
    return root


class ApiProcess:
    """A `prune api` process on a free loopback port."""

    def __init__(self, model, *extra: str, key=None, env=None):
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = key
        cmd = [
            sys.executable,
            "-m",
            "engine",
            "api",
            "--model",
            str(model),
            "--port",
            str(self.port),
            "-q",
            *extra,
        ]
        if key:
            cmd += ["--api-key", key]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prune api exited: {self.proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("prune api did not come up in 120 s")

    def prune(self, **body):
        req = urllib.request.Request(
            self.url + "/v1/prune",
            json.dumps(body).encode(),
            {
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.key}"} if self.key else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["results"]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def milvus_calls(address: str, calls: list[dict]) -> list[dict]:
    """`calls` made to a model service by the Milvus-like client (tests/server/milvus_client.py)
    in a process of its own; its answers."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.server.milvus_client", address],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# --------------------------------------------------------------------------- a recording onnxruntime
# A stand-in for a module (onnxruntime): every call made through it, on any object it hands
# out, is recorded with the calling thread, its arguments and when it ran, and passed on to
# the real thing. The GPU backend's tests read from it which thread made and ran every
# session, and in what order the copies, the synchronisation and the runs came.

_PLAIN = (str, bytes, int, float, bool, type(None), list, tuple, dict, np.ndarray, np.generic)


@dataclass
class Call:
    """One call: the thread that made it, `Class.method` (or the module's function), its
    arguments (real objects, not proxies), and its start and end (perf_counter)."""

    thread: int
    name: str
    args: tuple
    start: float
    end: float


class Recorder:
    """`wrap(module)`: the module as a proxy; `calls`: what was called through it."""

    def __init__(self):
        self.calls: list[Call] = []
        self.lock = threading.Lock()

    def wrap(self, target: Any, name: str | None = None) -> Any:
        """`target` behind a recording proxy."""
        return _Proxy(target, name or getattr(target, "__name__", type(target).__name__), self)

    def named(self, *names: str) -> list[Call]:
        """The calls of these names, in order."""
        return [c for c in self.calls if c.name in names]


def unwrapped(value: Any) -> Any:
    """The real object behind a recording proxy (and inside lists, tuples and dicts)."""
    if isinstance(value, _Proxy):
        return object.__getattribute__(value, "_target")
    if isinstance(value, list):
        return [unwrapped(v) for v in value]
    if isinstance(value, tuple):
        return tuple(unwrapped(v) for v in value)
    if isinstance(value, dict):
        return {k: unwrapped(v) for k, v in value.items()}
    return value


class _Proxy:
    def __init__(self, target: Any, name: str, recorder: Recorder):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_recorder", recorder)

    def __getattr__(self, attr: str) -> Any:
        target = object.__getattribute__(self, "_target")
        value = getattr(target, attr)
        if callable(value) or isinstance(value, types.ModuleType):
            owner = target.__name__ if isinstance(target, (type, types.ModuleType)) else type(target).__name__
            return _Proxy(value, f"{owner}.{attr}", object.__getattribute__(self, "_recorder"))
        return value

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_target"), attr, unwrapped(value))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = object.__getattribute__(self, "_target")
        recorder: Recorder = object.__getattribute__(self, "_recorder")
        args, kwargs = unwrapped(args), unwrapped(kwargs)
        start = time.perf_counter()
        result = target(*args, **kwargs)
        end = time.perf_counter()
        name = object.__getattribute__(self, "_name")
        if isinstance(target, type):
            name = f"{target.__name__}()"
        with recorder.lock:
            recorder.calls.append(
                Call(threading.get_ident(), name, args + tuple(kwargs.values()), start, end)
            )
        if isinstance(result, _PLAIN):
            return result
        return _Proxy(result, type(result).__name__, recorder)


def uncovered(text: str, spans) -> str:
    """The non-space characters of `text` outside every span (empty when the spans cover it)."""
    mask = bytearray(len(text))
    for s, e in spans:
        mask[s:e] = b"\x01" * (e - s)
    return "".join(ch for ch, m in zip(text, mask) if not m and not ch.isspace())


# ---- LLMLingua-2: texts and compress_prompt calls (tests/inprocess/test_llmlingua2.py checks them
# against llmlingua itself; tests/server/test_compress_triton.py sends them through Triton)
EN = (
    "The council met on Tuesday to talk about the old bridge.\nMost members wanted a new one, "
    "but the budget was small. Why not repair it? The engineer said that repairs would cost 2.5 "
    "million and last ten years! In the end they asked for a second report."
)
ZH = "昨天市议会开会讨论旧桥的问题。大多数人希望建一座新桥，但是预算很少。工程师说修理需要两百万。最后他们要求再写一份报告。"
JA = "昨日、市議会は古い橋について話し合いました。多くの人は新しい橋を望みましたが、予算は少なかったです。技術者は修理に二百万かかると言いました。"
PT = (
    "Ontem a câmara discutiu a velha ponte. A maioria queria uma nova, mas o orçamento era pequeno. "
    "Por que não consertar? O engenheiro disse que o conserto custaria 2,5 milhões! No fim, pediram "
    "outro relatório."
)
#: more than 510 model tokens: several chunks, cut back to the last "." or "\n"
LONG = " ".join(
    f"Report {i} says the river rose {i % 7} meters near the station.\nWorkers moved sand to the old road."
    for i in range(40)
)
#: no "." nor "\n" at all: chunks of 511 tokens, whose [SEP] the reference's truncation to 512 drops
LONG_CJK = "会议讨论了新桥和旧路，工人们在车站附近搬运沙子，" * 40
CONTEXTS = [EN, PT, "Prices rose 3 percent in March, and wages grew more slowly than prices.", ZH]

CASES = {
    "en-rate-force": (EN, dict(rate=0.33, force_tokens=["\n", "?", ".", "!"])),
    "zh": (ZH, dict(rate=0.5)),
    "ja-force": (JA, dict(rate=0.4, force_tokens=["。", "、"])),
    "pt-digits": (PT, dict(rate=0.5, force_reserve_digit=True)),
    "long-chunks": (LONG, dict(rate=0.5, force_tokens=["\n", "."])),
    "long-cjk-511": (LONG_CJK, dict(rate=0.3)),
    "target-token": (EN, dict(target_token=20)),
    "drop-consecutive": (
        EN + "\n\n\n" + PT + "\n\n",
        dict(rate=0.4, force_tokens=["\n", "."], drop_consecutive=True),
    ),
    "multi-token-force": (PT + "\n" + EN, dict(rate=0.4, force_tokens=["\n", "Por que", "?", "million and"])),
    "first-token": (EN, dict(rate=0.5, token_to_word="first")),
    "rate-1": (EN + "\n" + PT, dict(rate=1.0, force_tokens=["\n"])),
    "contexts-default": (CONTEXTS, dict(rate=0.5)),
    "contexts-force-ids": (CONTEXTS, dict(rate=0.5, context_level_rate=0.5, force_context_ids=[3])),
    "contexts-no-filter-target": (CONTEXTS, dict(use_context_level_filter=False, target_token=40)),
    "contexts-target-token": (CONTEXTS, dict(target_token=40, force_tokens=["\n"])),
    "contexts-target-context": (CONTEXTS, dict(target_context=2, rate=0.6)),
    "contexts-context-target-token": (CONTEXTS, dict(context_level_target_token=60, rate=0.5)),
    "contexts-no-token-filter": (CONTEXTS, dict(use_token_level_filter=False, context_level_rate=0.5)),
}


#: the installed console script
PRUNE = Path(sys.executable).parent / "prune"


def start_serve(repo, ports, api_port=0, *extra):
    """`prune serve` on free ports; with `api_port`, its HTTP API too (ready when it is)."""
    h, g, m = ports
    proc = subprocess.Popen(
        [
            str(PRUNE),
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            str(h),
            "--grpc-port",
            str(g),
            "--metrics-port",
            str(m),
            "--api-port",
            str(api_port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, ready = [], threading.Event()
    needle = "HTTP API ready" if api_port else "tritonserver ready"

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    assert ready.wait(120), "".join(lines[-30:])
    return proc, lines


#: the ONNX Runtime classes whose calls make or run a session (on the GPU thread, in the GPU tests)
SESSION_CALLS = ("InferenceSession", "IOBinding", "OrtValue", "SessionOptions")


def a_batch(rows: int, length: int, seed: int) -> ModelBatch:
    """A padded batch of random ids, its last seed % 7 + 1 positions padding, a sentence every 16 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 100, size=(rows, length)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, length - 1 - seed % 7 :] = 0
    sid = np.tile(np.arange(length) // 16, (rows, 1)).astype(np.int64)
    sid[mask == 0] = -1
    return ModelBatch(ids, mask, sid, np.zeros_like(ids), list(range(rows)))


class FakeDevice(DeviceMemory):
    """A GPU with `free` bytes free, which a test (or its sessions) lowers."""

    def __init__(self, free: int):
        self.device_id, self.now = 0, free
        self._read = lambda: (self.now, 80 * 2**30)
