"""A call's cancellation: a caller that gives up on a call (the HTTP API past `--request-timeout`,
a gRPC call past its deadline, an MCP tool past its timeout) sets the call's stop event, and the
work stops at its next check, between two model batches, so an abandoned call frees its worker
within one batch's time instead of running to its end.

The caller's side is `run_cancellable(stop, fn, ...)`, run in its pool, and `stop.set()` to give
up; the work's side is `check_cancelled()` between batches (the Pruner's `infer_batches`, the
Compressor's chunks, the retrieval embedder's batches). A call run without a stop event (the
Python API, the CLI) is never cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from engine.errors import Cancelled

#: the stop event of the call running in this thread (or task), if its caller can give up on it
_STOP: ContextVar[threading.Event | None] = ContextVar("prune_call_stop", default=None)


def run_cancellable(stop: threading.Event, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as a call that stops at its next `check_cancelled()` once `stop` is set."""
    token = _STOP.set(stop)
    try:
        return fn(*args)
    finally:
        _STOP.reset(token)


def check_cancelled() -> None:
    """Raise Cancelled if the caller of the call running here has given up on it."""
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        raise Cancelled("the call was abandoned by its caller (past its deadline); its work stopped")


def infer_batches(core: Any, batches: Sequence[Any]) -> list[Any]:
    """A call's batches on a pruner's core (engine.backends.base.Backend): one after another in
    this thread, `check_cancelled()` before each; a core that sends a call's batches together
    (`sends_together`: a remote core, whose transport's deadline bounds them) gets them at once."""
    check_cancelled()
    if core.sends_together:
        return core.infer_many(batches)
    out = []
    for batch in batches:
        check_cancelled()
        out.append(core.infer(batch))
    return out
