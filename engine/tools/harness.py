"""What the benchmarks share: `prune bench`, the retrieval benchmark and the operator
profiler (benchmarks/, dev/).

- `machine_info` / `machine_line`: the machine, in a report's words;
- `Study`: a benchmark's command line, its machine, and its report written as `NAME.json`
  (the figures, the command, the machine, the date) and `NAME.md` (the command and the
  machine above its own table).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from engine.measure.timing import cpu_model


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """The machine, in a benchmark's words: CPU, cores, flags, memory, versions."""
    import numpy as np
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}
    try:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        info["onnxruntime"] = "-"
    model = cpu_model()
    if model is not None:
        info["cpu_model"] = model
    from engine.measure.cpu import CpuKind
    kind = CpuKind.here()
    info["cpu_flags"], info["cpu_kind"] = kind.shown_flags(), kind.name
    try:
        import torch
        info["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def machine_line(info: dict[str, Any]) -> str:
    """One line for a report: CPU, cores and the runtimes' versions."""
    kind = f" ({info['cpu_kind']}: {' '.join(info.get('cpu_flags') or []) or 'no AVX flags'})" \
        if info.get("cpu_kind") else ""
    parts = [f"{info.get('cpu_model', info['processor'])}{kind}, {info['cpus']} CPUs", f"Python {info['python']}",
             f"onnxruntime {info['onnxruntime']}"]
    if "torch" in info:
        parts.append(f"torch {info['torch']}")
    if "gpu" in info:
        parts.append(info["gpu"])
    return "; ".join(parts)


def parser(doc: str | None, out: str | None = None, repeats: int = 5) -> argparse.ArgumentParser:
    """A benchmark's argument parser with the flags every one shares: --repeats, --threads
    and --out (required when `out` is None, else that folder by default)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=repeats, help=f"interleaved rounds, medians (default {repeats})")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    if out is None:
        ap.add_argument("--out", type=Path, required=True, help="folder for the report (NAME.json, NAME.md)")
    else:
        ap.add_argument("--out", type=Path, default=Path(out), help=f"folder for the report (default {out})")
    return ap


class Study:
    """One run of a benchmark: `Study("retrieval", "benchmarks.retrieval", argv)`; its
    `command` (to paste beside the figures), `machine` and `write`."""

    def __init__(self, name: str, module: str, argv: list[str] | None = None, device: str = "cpu"):
        self.name = name
        self.command = shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
        self.machine = machine_info(device)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")

    def header(self, title: str, method: str = "") -> list[str]:
        """The report's first lines: title, command, machine and how it was measured."""
        return [f"# {title}", "", "```", self.command, "```", "",
                f"Machine: {machine_line(self.machine)}." + (f" {method}" if method else ""), ""]

    def write(self, out: Path, figures: dict[str, Any], markdown: list[str], echo: bool = True) -> Path:
        """`out/NAME.json` (figures + command, machine, date) and `out/NAME.md`; the md's path."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"study": self.name, "command": self.command, "machine": self.machine, "date": self.started, **figures}
        (out / f"{self.name}.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        text = "\n".join(markdown).rstrip() + "\n"
        (out / f"{self.name}.md").write_text(text)
        if echo:
            print(text, end="")
        return out / f"{self.name}.md"
