"""What the benchmarks share: `prune bench`, the retrieval benchmark and the operator
profiler (benchmarks/, dev/).

- `machine_info` / `machine_line`: the machine, in a report's words (engine.machine.describe);
- `Study`: a benchmark's command line, its machine, and its report written as `NAME.json`
  (the figures, the command, the machine, the date) and `NAME.md` (the command and the
  machine above its own table).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from engine.machine.describe import machine_info, machine_line


def parser(doc: str | None, out: str | None = None, repeats: int = 5) -> argparse.ArgumentParser:
    """A benchmark's argument parser with the flags every one shares: --repeats, --threads
    and --out (required when `out` is None, else that folder by default)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--repeats", type=int, default=repeats, help=f"interleaved rounds, medians (default {repeats})"
    )
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    if out is None:
        ap.add_argument("--out", type=Path, required=True, help="folder for the report (NAME.json, NAME.md)")
    else:
        ap.add_argument("--out", type=Path, default=Path(out), help=f"folder for the report (default {out})")
    return ap


class Study:
    """One run of a benchmark: `Study("retrieval", "benchmarks.retrieval", argv)`; its
    `command` (to paste beside the figures; `command` when it is not `python -m module`),
    `machine` and `write`."""

    def __init__(
        self,
        name: str,
        module: str,
        argv: list[str] | None = None,
        device: str = "cpu",
        command: str | None = None,
    ):
        self.name = name
        self.command = command or shlex.join(
            ["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]
        )
        self.machine = machine_info(device)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def header(self, title: str, method: str = "") -> list[str]:
        """The report's first lines: title, command, machine and how it was measured."""
        return [
            f"# {title}",
            "",
            "```",
            self.command,
            "```",
            "",
            f"Machine: {machine_line(self.machine)}." + (f" {method}" if method else ""),
            "",
        ]

    def write(self, out: Path, figures: dict[str, Any], markdown: list[str], echo: bool = True) -> Path:
        """`out/NAME.json` (figures + command, machine, date) and `out/NAME.md`; the md's path."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "study": self.name,
            "command": self.command,
            "machine": self.machine,
            "date": self.started,
            **figures,
        }
        (out / f"{self.name}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        text = "\n".join(markdown).rstrip() + "\n"
        (out / f"{self.name}.md").write_text(text)
        if echo:
            print(text, end="")
        return out / f"{self.name}.md"
