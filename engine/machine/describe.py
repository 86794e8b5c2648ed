"""The machine, in a report's words: CPU model, cores, the flags that decide which precisions
run fast, memory and the runtimes' versions (a GPU's name where torch already runs on one).
Torch-free: versions are read from the installed packages' metadata, not by importing them."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

from engine.machine.cpu import CpuKind
from engine.machine.timing import cpu_model


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """The machine, in a benchmark's words: CPU, cores, flags, versions."""
    import numpy as np

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    info["onnxruntime"] = _version("onnxruntime") or _version("onnxruntime-gpu") or "-"
    model = cpu_model()
    if model is not None:
        info["cpu_model"] = model
    kind = CpuKind.here()
    info["cpu_flags"], info["cpu_kind"] = kind.shown_flags(), kind.name
    torch_version = _version("torch")
    if torch_version:
        info["torch"] = torch_version
    torch = sys.modules.get("torch")  # the GPU's name only where torch already runs here
    if device == "cuda" and torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def machine_line(info: dict[str, Any]) -> str:
    """One line for a report: CPU, cores and the runtimes' versions."""
    kind = (
        f" ({info['cpu_kind']}: {' '.join(info.get('cpu_flags') or []) or 'no AVX flags'})"
        if info.get("cpu_kind")
        else ""
    )
    parts = [
        f"{info.get('cpu_model', info['processor'])}{kind}, {info['cpus']} CPUs",
        f"Python {info['python']}",
        f"onnxruntime {info['onnxruntime']}",
    ]
    if "torch" in info:
        parts.append(f"torch {info['torch']}")
    if "gpu" in info:
        parts.append(info["gpu"])
    return "; ".join(parts)
