"""The Triton half of loading, the public API's doors' work: `Pruner.connect`'s (a served text
model gives a `TritonTextPruner`, text in, results out; a core model gives a `Pruner` whose core is
the server, the client splitting and tokenizing) and `Compressor.connect`'s (a compressor's text
model gives a `TritonCompressor`). The one import upward of the house runs to this module
(docs/development.md, "Import rules")."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.pipeline.encode import BatchingConfig
from engine.pipeline.spec import Manifest, load_tokenizer
from engine.protocol import PrunerProtocol
from engine.settings import DEFAULTS


def connect(
    url: str | Sequence[str],
    model: str,
    *,
    protocol: str = "grpc",
    tokenizer: str | Path | None = None,
    batching: BatchingConfig | None = None,
    timeout: float = DEFAULTS.timeout,
    retries: int = 3,
    backoff: float = 0.5,
    concurrency: int = 8,
    ready_timeout: float = 10.0,
    replica_options: dict[str, Any] | None = None,
) -> PrunerProtocol:
    """The Pruner API on a model of a Triton server (see `prune repository`).

    `url` is one server (`host:port`) or several replicas of it: a list of endpoints, a
    comma-separated string, or `dns:///name:port` (every address the name resolves to,
    re-resolved as it changes: a headless Kubernetes Service). Requests then go to the
    least busy ready replica and fail over to another on connection errors and timeouts
    (`engine.triton.replicas`; `replica_options`: try_timeout, health_interval,
    resolve_interval, log). Several replicas need gRPC.

    A text model (`<name>_text`) takes the question and passages as text and does
    everything on the server: the client needs no tokenizer (returns a `TritonTextPruner`).
    A core model takes token ids: the client splits and tokenizes, with the manifest from
    the model's config and the tokenizer from the text model beside it (or `tokenizer`: an
    export folder or a tokenizer.json).

    `timeout` is the deadline of one `prune()` call: every request carries what is left of
    it, and retries of connection errors (`retries`, exponential `backoff`) stop when it is
    spent, so a call ends in at most `timeout` seconds.
    """
    from engine.backends.triton import TritonBackend
    from engine.pruner import Pruner
    from engine.triton.client import Transport, TritonClient
    from engine.triton.replicas import ReplicaSet, is_replicated

    transport: Transport
    if is_replicated(url):
        transport = ReplicaSet(
            url,
            model,
            protocol=protocol,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            concurrency=concurrency,
            ready_timeout=ready_timeout,
            **(replica_options or {}),
        )
    else:  # a single host:port (is_replicated takes every list)
        transport = TritonClient(
            str(url),
            model,
            protocol=protocol,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            concurrency=concurrency,
            ready_timeout=ready_timeout,
        )
    if transport.is_text_model:
        from engine.remote.text_pruner import TritonTextPruner

        return TritonTextPruner(transport)
    try:
        core = TritonBackend(transport)
    except Exception:
        transport.close()
        raise
    spec = Manifest.from_dict(core.manifest(), where=model).spec(name=model)
    if tokenizer is not None:
        path = Path(tokenizer)
        tok = load_tokenizer(path / "tokenizer.json" if path.is_dir() else path)
    else:
        text = core.tokenizer_json()
        if text is None:
            raise ModelLoadError(
                f"model {model!r} has no text model to fetch its tokenizer from: pass "
                "tokenizer= (the export folder)"
            )
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(text)
        tok.no_padding()
        tok.no_truncation()
    missing = set(spec.input_names) - set(core.input_names)
    if missing:
        raise ModelLoadError(f"model {model!r} lacks inputs {sorted(missing)}")
    return Pruner(core, tok, spec, batching)


def connect_compressor(url: str, model: str, **kwargs: Any) -> Any:
    """`Compressor.connect`'s work: the Compressor API (compress, describe, close) on a compressor's
    text model `model` of the Triton server at `url` (host:port); the keywords are TritonClient's
    (protocol, timeout, retries, backoff, ready_timeout)."""
    from engine.remote.compress_client import TritonCompressor

    return TritonCompressor.connect(url, model, **kwargs)
