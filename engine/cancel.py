"""A call's cancellation: a caller that gives up on a call (the HTTP API past
`--request-timeout`, a gRPC call past its deadline) sets the call's stop event, and the
work stops at its next check, between two model batches, so an abandoned call frees its
worker within one batch's time instead of running to its end.

    stop = threading.Event()
    pool.submit(cancel.run, stop, pruner.prune, question, passages)   # the caller: stop.set() to give up
    ...
    cancel.check()         # the work, between batches: raises Cancelled once stop is set

Torch-free; a call run without a stop event (the Python API, the CLI) is never cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from engine.backends.base import Backend
from engine.errors import Cancelled

#: the stop event of the call running in this thread (or task), if its caller can give up on it
_STOP: ContextVar[threading.Event | None] = ContextVar("prune_call_stop", default=None)


def run(stop: threading.Event, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as a call that stops at its next `check()` once `stop` is set."""
    token = _STOP.set(stop)
    try:
        return fn(*args)
    finally:
        _STOP.reset(token)


def check() -> None:
    """Raise Cancelled if the caller of the call running here has given up on it."""
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        raise Cancelled("the call was abandoned by its caller (past its deadline); its work stopped")


def infer_batches(backend: Any, batches: Sequence[Any]) -> list[Any]:
    """`backend.infer_many(batches)`, with `check()` before each batch where the core runs them
    one after another in this thread (an in-process core: the Backend's own `infer_many`). A
    remote core, which sends a call's batches together, gets them at once: its transport's
    deadline bounds it."""
    check()
    if getattr(type(backend), "infer_many", None) is not Backend.infer_many:
        return backend.infer_many(batches)
    out = []
    for batch in batches:
        check()
        out.append(backend.infer(batch))
    return out
