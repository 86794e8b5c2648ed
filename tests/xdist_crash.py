"""What a crashed pytest-xdist worker died of, in the run's output.

xdist reports a worker that vanished as "node down: Not properly terminated" and nothing
more; this hook (loaded by tests/conftest.py) adds the worker's pid and its exit status
(the signal that killed it, or its exit code), read from the worker process itself. With
`--max-worker-restart 0` (pyproject's addopts) the run then ends instead of going on with a
replacement worker."""

from __future__ import annotations

import signal
import subprocess
import sys


def exit_status(returncode: int | None) -> str:
    """A process's end as a person reads it."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def pytest_testnodedown(node, error):
    """(pytest-xdist's hook, in the controller) A worker went down: say how it ended."""
    if not error:
        return
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return
    try:
        returncode = popen.wait(5)
    except subprocess.TimeoutExpired:
        returncode = None
    print(
        f"\n[{node.gateway.id}] worker pid {popen.pid} {exit_status(returncode)} ({error})",
        file=sys.stderr,
        flush=True,
    )
