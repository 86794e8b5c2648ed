"""The watchdog of a `TritonServer`: `python -m engine.triton.watchdog STARTER GROUP WORK`.

A small process started beside tritonserver. Every 0.2 s it checks whether its starter
(the process that ran `prune serve` or made the `TritonServer`) is still its parent; when
not (the starter died, even by SIGKILL), it kills the server's process group (the server
and its python-backend stubs) and removes the server's work folder. It ends by itself
when the group is gone. Standard library only: it must start fast and never fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def watch(starter: int, group: int, work: str, interval: float = 0.2) -> None:
    """Kill process group `group` when `starter` dies, then remove `work`."""
    while _alive(group):
        if os.getppid() != starter:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for _ in range(50):
                if not _alive(group):
                    break
                time.sleep(0.1)
            shutil.rmtree(work, ignore_errors=True)
            return
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.triton.watchdog STARTER GROUP WORK`."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the terminal is for the starter
    watch(int(args[0]), int(args[1]), args[2])


if __name__ == "__main__":
    main()
