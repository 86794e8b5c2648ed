"""`prune capacity`, kept under its old name: `python -m benchmarks.capacity ARGS` runs
`prune capacity ARGS` (the model: engine/tools/capacity.py; docs/scaling.md)."""
from __future__ import annotations

import sys

from engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["capacity", *sys.argv[1:]]))
