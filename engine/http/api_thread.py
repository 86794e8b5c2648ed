"""The HTTP API on uvicorn in a background thread: what `prune serve` runs beside
tritonserver, and what the benchmark and the tests start on a free port.

`prune api` runs uvicorn in the main thread instead (its signal handling is uvicorn's own).
In a thread uvicorn installs no signal handlers; the owner stops it with `stop()`, which
drains: requests in flight finish, up to `timeout_graceful_shutdown` seconds."""

from __future__ import annotations

import threading
import time
from typing import Any

from engine.errors import BackendError


class ApiThread:
    """The ASGI `app` served on host:port from a daemon thread; a context manager."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        log_level: str = "warning",
        graceful_s: float = 30.0,
    ):
        import uvicorn

        self.host, self.port = host, port
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                lifespan="on",
                timeout_graceful_shutdown=int(graceful_s),
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API's base URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 20.0) -> "ApiThread":
        """Start serving and wait until the port answers."""
        self._thread = threading.Thread(target=self._server.run, name="prune-api-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():  # uvicorn logs why (the port is taken, ...)
                raise BackendError(f"the HTTP API could not start on {self.host}:{self.port}")
            if time.monotonic() > deadline:
                self.stop()
                raise BackendError(
                    f"the HTTP API did not start on {self.host}:{self.port} within {timeout:.0f} s"
                )
            time.sleep(0.02)
        return self

    def alive(self) -> bool:
        """Whether the server thread still runs."""
        return bool(self._thread and self._thread.is_alive())

    def stop(self, timeout: float = 40.0) -> bool:
        """Stop accepting, drain what is in flight; True when the thread ended in time."""
        self._server.should_exit = True
        if self._thread:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def __enter__(self) -> "ApiThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
