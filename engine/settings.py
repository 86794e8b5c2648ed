"""Every deployment-relevant default in one place, each also read from a `PRUNE_*` variable.

As TEI and Infinity do, each setting that a deployment tunes has an environment variable
and, where a command takes it, a command-line flag of the same name (`--max-batch-tokens`,
`PRUNE_MAX_BATCH_TOKENS`): a flag given on the command line wins, then the variable, then
the default here. The table
in docs/configuration.md is made from `SETTINGS` (a test keeps the two equal).

    from engine.settings import DEFAULTS, setting
    DEFAULTS.max_batch_tokens      # the built-in default: 16384
    setting("max_batch_tokens")    # what applies now: $PRUNE_MAX_BATCH_TOKENS or 16384

Torch-free, standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from engine.errors import SettingError


@dataclass(frozen=True)
class Setting:
    """One setting: its name, default, help, type, and whether it has a flag."""

    name: str  # python name; the flag is --name-with-dashes
    default: Any
    help: str
    type: Callable[[str], Any] = str
    env: str = ""  # PRUNE_NAME unless set (kept names: PRUNE_INTRA_OP_THREADS)
    choices: tuple[str, ...] | None = None
    secret: bool = False  # never printed (keys)
    flag_too: bool = True  # False: a variable only (no command takes it as a flag)

    @property
    def variable(self) -> str:
        """Its PRUNE_* environment variable."""
        return self.env or "PRUNE_" + self.name.upper()

    @property
    def flag(self) -> str:
        """Its command-line flag."""
        return "--" + self.name.replace("_", "-")

    def value(self, environ: dict[str, str] | None = None) -> Any:
        """The variable's value (parsed and checked) if set and non-empty, else the default."""
        raw = (os.environ if environ is None else environ).get(self.variable, "")
        if raw.strip() == "":
            return self.default
        try:
            value = self.type(raw.strip())
        except ValueError:
            raise SettingError(
                f"{self.variable}={raw!r} is not a valid {getattr(self.type, '__name__', 'value')}"
            ) from None
        if self.choices and value not in self.choices:
            raise SettingError(f"{self.variable} must be one of {self.choices}, got {value!r}")
        return value


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive_int.__name__ = "positive integer"  # what the error message calls it

#: a `gpu_memory` setting: a share of the free memory at load (0 < share <= 1), or a size with its unit
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(?:(k|m|g|t)(i)?)?b\s*$", re.IGNORECASE)


def memory_limit(text: str | float | int) -> float | int:
    """A `gpu_memory` setting parsed: a share of the free memory in (0, 1] (0.8), or bytes from a
    size with its unit (24GiB, 512MiB, 20GB, 1000000B); ValueError else."""
    if isinstance(text, int) and not isinstance(text, bool):  # bytes, as a parsed size is
        if text < 2**20:
            raise ValueError(f"{text} bytes: a GPU memory budget is at least 1 MiB (a share is a float, 0.8)")
        return text
    raw = str(text).strip()
    try:
        share = float(raw)
    except ValueError:
        m = _SIZE.match(raw)
        if not m:
            raise ValueError(raw) from None
        unit = (m.group(2) or "").lower()
        scale = 1024 if m.group(3) else 1000
        size = int(float(m.group(1)) * scale ** (" kmgt".index(unit) if unit else 0))
        if size < 1:
            raise ValueError(raw) from None
        return size
    if not 0 < share <= 1:
        raise ValueError(raw)
    return share


memory_limit.__name__ = "share of the free memory (0-1) or a size (24GiB)"

_ALL = [
    # ---- the batcher (in-process and the Triton text model)
    Setting(
        "max_batch_tokens",
        16384,
        "padded tokens per model batch; larger batches help until the core is compute bound",
        positive_int,
    ),
    Setting("max_batch_size", 64, "rows per model batch", positive_int),
    Setting(
        "device",
        "cpu",
        "where the model runs: cpu, or cuda (ONNX Runtime's CUDA provider, pip install 'prune-engine[gpu]')",
        choices=("cpu", "cuda"),
    ),
    Setting(
        "threads",
        None,
        "ONNX Runtime's (or torch's) intra-op threads; default: all cores",
        positive_int,
        env="PRUNE_INTRA_OP_THREADS",
    ),
    Setting(
        "ort_arena",
        "shrink",
        "ONNX Runtime's CPU arena after a run: shrink (memory of a large batch "
        "goes back), keep (ORT's default), off",
        choices=("shrink", "keep", "off"),
    ),
    Setting(
        "ort_denormals",
        "flush",
        "ONNX Runtime's denormal floats: flush (to zero, FTZ/DAZ: masked attention "
        "makes them, and on Intel CPUs each costs a microcode assist) or keep (IEEE, ORT's default)",
        choices=("flush", "keep"),
        flag_too=False,
    ),
    Setting(
        "gpu_graphs",
        24,
        "shapes (rows x length) the GPU graph captures as CUDA graphs at most (--device cuda): "
        "each shares the one copy of the weights and holds its own activations; a batch whose shape is not "
        "captured runs on the dynamic session, and its shape is captured when the GPU is next idle; 0: none",
        int,
        flag_too=False,
    ),
    Setting(
        "gpu_warm",
        "all",
        "when the GPU graph captures its shapes (--device cuda): all: at load, every shape its batches "
        "can take, smallest first, within gpu_graphs and gpu_memory, before the model is ready (no "
        "request waits for a capture); lazy: each shape when the GPU is next idle after its first batch",
        choices=("all", "lazy"),
        flag_too=False,
    ),
    Setting(
        "gpu_memory",
        0.8,
        "device memory a GPU graph model may hold (its weights, dynamic session and captured shapes, "
        "each measured as the free memory it took): a share of the GPU's free memory when the model "
        "starts loading (0.8), or a size (24GiB); a shape that would pass it is not captured",
        memory_limit,
        flag_too=False,
    ),
    Setting(
        "merge_calls",
        "auto",
        "concurrent calls' batches of one length joined into one model run (each call gets its own rows "
        "back; the API's workers are its callers): on, off, or auto: on with --device cuda, off on a CPU "
        "(docs/decisions.md)",
        choices=("auto", "on", "off"),
    ),
    # ---- what one call may hold (every entry point: docs/limits.md)
    Setting("max_passages", 10_000, "passages in one call", positive_int, flag_too=False),
    Setting(
        "max_call_chars",
        2_000_000,
        "characters in one call, question and passages together "
        "(one call at the limit peaks at 0.6-1.4 GB RSS)",
        positive_int,
        flag_too=False,
    ),
    # ---- the Triton core model (prune repository, cpu target)
    Setting(
        "join_requests",
        "auto",
        "whether the cpu core model runs the requests Triton's dynamic batcher "
        "groups as one padded batch (always) or each alone (never: an answer never depends on its batch "
        "company); auto: alone for INT8 graphs, whose activation scales are taken per batch",
        choices=("auto", "always", "never"),
    ),
    # ---- the Triton text model's per-request limits (prune repository)
    Setting("text_max_passages", 1_000, "passages per request of a text model", positive_int),
    Setting(
        "text_max_chars",
        2_000_000,
        "characters per request of a text model, question and passages together",
        positive_int,
    ),
    # ---- clients of a Triton server
    Setting(
        "timeout", 30.0, "seconds one call to a Triton server may take, retries included (--server)", float
    ),
    # ---- prune serve (tritonserver)
    Setting(
        "host",
        "127.0.0.1",
        "address the servers bind (loopback unless told otherwise); prune serve: "
        "the HTTP API's, and tritonserver's only with --api-port 0",
    ),
    Setting(
        "triton_host",
        None,
        "address tritonserver binds under prune serve (default: 127.0.0.1 while the "
        "HTTP API is on, so only the API faces clients; else --host)",
    ),
    Setting(
        "triton_http",
        "on",
        "tritonserver's own KServe v2 HTTP endpoint under prune serve: on, or off "
        "(gRPC and the HTTP API only; readiness is asked over gRPC)",
        choices=("on", "off"),
    ),
    Setting(
        "api_port",
        8080,
        "the HTTP API's port beside tritonserver (prune serve; needs [api] and a text "
        "model in the repository); 0: no API",
        int,
    ),
    Setting("http_port", 8000, "tritonserver's KServe v2 HTTP port", int),
    Setting("grpc_port", 8001, "tritonserver's KServe v2 gRPC port", int),
    Setting("metrics_port", 8002, "tritonserver's Prometheus metrics port", int),
    Setting(
        "admin_key",
        None,
        "the shared-memory, trace and logging APIs answer only requests with the "
        "header 'prune-admin-key: KEY' (default: none, so they are refused)",
        secret=True,
    ),
    Setting("max_restarts", 5, "restarts of a dead server or stub allowed within a minute", int),
    Setting(
        "tritonserver",
        None,
        "the tritonserver binary (default: the one nvidia-pytriton ships)",
        flag_too=False,
    ),
    # ---- prune api (the HTTP API)
    Setting(
        "text_model",
        None,
        "the Triton text model a --server call goes to (prune run, ask, api), the "
        "one prune serve's HTTP API serves, and the one python -m engine.remote.probe checks (default: "
        "prune serve: the repository's only *_text model; else default_text, what prune repository writes "
        "with no --name)",
    ),
    Setting("port", 8080, "the HTTP API's port (prune api)", int),
    Setting(
        "api_key",
        None,
        "the HTTP API answers only requests with 'Authorization: Bearer KEY' "
        "(/health and /metrics excepted; default: no key)",
        secret=True,
    ),
    Setting(
        "workers",
        None,
        "threads the HTTP API runs its one shared pruner in; default: 1 in-process (the "
        "session already uses every core: 1 thread was fastest at 16 concurrent clients, "
        "docs/decisions.md), 16 with --device cuda (calls are tokenized while the GPU runs, and the "
        "batches of those waiting merge into one run), 16 in front of a Triton server (the calls wait on "
        "the network)",
        positive_int,
    ),
    Setting(
        "max_concurrent",
        64,
        "requests the HTTP API serves at once; past it, 429 with Retry-After",
        positive_int,
    ),
    Setting("request_timeout", 60.0, "seconds an HTTP API request may take; past it, 504", float),
    Setting(
        "model_service_port",
        None,
        "serve Milvus's model service (gRPC: Highlight, Rerank, Embedding) on "
        "this port beside the HTTP API, for Milvus's SemanticHighlighter (docs/milvus.md); default: off",
        int,
    ),
    Setting(
        "max_body_bytes", 16_000_000, "bytes an HTTP API request body may hold; past it, 413", positive_int
    ),
    # ---- files
    Setting(
        "cache",
        None,
        "where the default model is exported on first use (default: "
        "$XDG_CACHE_HOME/prune-engine, else ~/.cache/prune-engine)",
        flag_too=False,
    ),
    Setting(
        "default_precision",
        "auto",
        "the precision the default model is exported at on first use: auto "
        "(the fastest that passes the fidelity gate on this CPU, as prune export --precision auto; what it "
        "picked is printed and kept in the manifest), fp32 (the reference: the same scores on every "
        "machine), int8, or fp16 (the GPU graph, which --device cuda loads whatever this says)",
        choices=("fp32", "int8", "auto", "fp16"),
        flag_too=False,
    ),
    # ---- the retrieval pipeline (prune index / prune ask)
    Setting("chunk_tokens", 200, "encoder tokens per indexed chunk (whole sentences)", positive_int),
    Setting(
        "candidates",
        20,
        "chunks retrieved before reranking (prune ask)",
        positive_int,
        env="PRUNE_ASK_CANDIDATES",
    ),
    Setting("k", 5, "chunks returned after reranking (prune ask)", positive_int, env="PRUNE_ASK_K"),
]
SETTINGS: dict[str, Setting] = {s.name: s for s in _ALL}
#: the torch backend's choices (LoadOptions.dtype and .attn; prune run --dtype, --attn): no variable
TORCH_DTYPES = ("float32", "float16", "bfloat16")
TORCH_ATTENTIONS = ("eager", "sdpa")


class _Defaults:
    """Attribute access to the built-in defaults (`DEFAULTS.max_batch_tokens`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return SETTINGS[name].default
        except KeyError:
            raise AttributeError(name) from None


DEFAULTS = _Defaults()


def setting(name: str, environ: dict[str, str] | None = None) -> Any:
    """The value in force: the `PRUNE_*` variable if set, else the default."""
    return SETTINGS[name].value(environ)


def default_workers(remote: bool, device: str) -> int:
    """The HTTP API's worker threads when `workers` is not set (its help says why): 16 in front
    of a server, 16 on a GPU, 1 in-process on a CPU."""
    return 16 if remote or device == "cuda" else 1


def checked(name: str, value: Any, error: type[Exception] = SettingError, what: str | None = None) -> Any:
    """`value` if it is one of setting `name`'s choices, else `error` naming them: where an
    option of that setting is made (LoadOptions, the repository's options, the backends)."""
    s = SETTINGS[name]
    if value not in (s.choices or ()):
        raise error(f"{what or name} must be one of {', '.join(s.choices or ())}, got {value!r}")
    return value


def help_text(name: str, extra: str = "") -> str:
    """A flag's help: what it does, its variable and its default, each said once."""
    s = SETTINGS[name]
    default = "" if s.secret or s.default is None else f"; default {s.default}"
    return f"{s.help}{extra} (env {s.variable}{default})"


def markdown_table() -> str:
    """The table of docs/configuration.md."""
    rows = ["| flag | environment variable | default | what it sets |", "|---|---|---|---|"]
    for s in _ALL:
        default = "none" if s.default is None else f"`{s.default}`"
        flag = f"`{s.flag}`" if s.flag_too else "(variable only)"
        rows.append(f"| {flag} | `{s.variable}` | {default} | {s.help} |")
    return "\n".join(rows)
