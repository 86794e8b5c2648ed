"""The GPU graph's device memory: what CUDA says is free (`DeviceMemory`), and the budget a
model's sessions and captured shapes stay within (`MemoryBudget`, the `gpu_memory` setting).

Each captured shape is a session of its own: its CUDA provider, arena, cuBLAS and cuDNN
handles, and the activations of its shape, held for as long as the shape is (the captured graph
replays into them). At DeBERTa-v3-large's width a 32 x 512 shape was estimated at 1-1.5 GiB
(../reference/gpu-review-2.md): unbounded, 24 such shapes do not fit a GPU. So every session's
bytes are measured when it is made (the free memory it took) and no capture goes past the
budget: a shape whose predicted bytes (its tokens times the most bytes per token a shape has
taken so far) would pass it is not captured, and one that passed it when made is released.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from engine.errors import BackendError, ModelLoadError
from engine.settings import memory_limit


class DeviceMemory:
    """The GPU's free memory as CUDA reports it (`cudaMemGetInfo` of the CUDA runtime ONNX Runtime
    loaded, else NVML's `nvmlDeviceGetMemoryInfo`), for the GPU graph's budget and report: what a
    session or a captured shape holds is the free memory it took. Every process on the device
    counts, so the figures are this process's only where it has the GPU to itself. `free()` is
    None where nothing can be read (the CPU provider, a machine without the libraries)."""

    def __init__(self, device: str = "cuda", device_id: int = 0):
        self.device_id = device_id
        self._read: Callable[[], tuple[int, int]] | None = None
        if device == "cuda":
            self._read = _cuda_memory(device_id) or _nvml_memory(device_id)

    def free(self) -> int | None:
        """Free bytes on the device now (None: not measured)."""
        return None if self._read is None else self._read()[0]


def _cuda_memory(device_id: int) -> Callable[[], tuple[int, int]] | None:
    """cudaMemGetInfo of the CUDA runtime in the process (ONNX Runtime's), as (free, total)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()

        def read(lib: Any = lib, free: Any = free, total: Any = total) -> tuple[int, int]:
            lib.cudaSetDevice(ctypes.c_int(device_id))
            status = lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
            if status != 0:
                raise BackendError(f"cudaMemGetInfo failed (CUDA error {status})")
            return int(free.value), int(total.value)

        try:
            read()
        except (BackendError, AttributeError):
            continue
        return read
    return None


def _nvml_memory(device_id: int) -> Callable[[], tuple[int, int]] | None:
    """NVML's memory of device `device_id` (the driver's libnvidia-ml), as (free, total)."""

    class Info(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device_id), ctypes.byref(handle)) != 0:
            return None
    except (OSError, AttributeError):
        return None

    def read() -> tuple[int, int]:
        info = Info()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0:
            raise BackendError("nvmlDeviceGetMemoryInfo failed")
        return int(info.free), int(info.total)

    return read


@dataclass
class Shape:
    """A captured shape's cost: its device bytes (None: not measured) and build-and-capture seconds."""

    rows: int
    length: int
    bytes: int | None
    seconds: float


def parsed_limit(value: str | float | int) -> float | int:
    """A `gpu_memory` setting parsed (engine.settings.memory_limit); ModelLoadError if it is neither
    a share nor a size."""
    try:
        return memory_limit(value)
    except ValueError as exc:
        raise ModelLoadError(f"gpu_memory {exc}: a share of the free memory (0.8) or a size (24GiB)") from exc


class MemoryBudget:
    """A GPU model's device bytes: the weights, the dynamic session and each captured shape,
    measured as the free memory each took (`DeviceMemory`), against `limit` (a `gpu_memory`
    setting: a share of the free memory when the model started loading, or bytes). Where the
    memory cannot be read (the CPU provider) nothing is measured and no capture is refused."""

    def __init__(self, memory: DeviceMemory, limit: float | int):
        self.memory = memory
        self.limit = limit  # parsed (engine.settings.memory_limit)
        self.free_at_load = memory.free()
        self.budget: int | None = None
        if self.free_at_load is not None:
            share = isinstance(self.limit, float)
            self.budget = int(self.limit * self.free_at_load) if share else int(self.limit)
        self.weights: int | None = None
        self.dynamic: int | None = None
        self.shapes: dict[tuple[int, int], Shape] = {}
        self.refused: list[tuple[int, int]] = []  # shapes not captured: past the budget
        #: every shape measured, kept or released: (tokens, bytes), what the prediction is fitted on
        self.measured: list[tuple[int, int]] = []
        #: tokens of the largest batch the dynamic session may run (the largest serving shape): its
        #: arena grows to that batch's activations, which captures leave room for
        self.reserve_tokens = 0

    def mark(self) -> int | None:
        """The free bytes now (None: not measured), to pass to `took`."""
        return self.memory.free()

    def took(self, before: int | None) -> int | None:
        """The bytes taken since `before` was marked (None: not measured)."""
        now = self.memory.free()
        return None if before is None or now is None else max(0, before - now)

    @property
    def used(self) -> int:
        """Bytes measured so far: weights, dynamic session, captured shapes."""
        shapes = list(self.shapes.values())  # the GPU thread may add one meanwhile
        return (self.weights or 0) + (self.dynamic or 0) + sum(s.bytes or 0 for s in shapes)

    def cost(self) -> tuple[float, float] | None:
        """(bytes a captured shape holds whatever its size, bytes per token) fitted to the shapes
        measured so far (least squares over two token counts or more; with one, all of its bytes per
        token, which over-predicts larger shapes), or None before any."""
        points = [(t, b) for t, b in self.measured if b]
        if not points:
            return None
        if len({t for t, _ in points}) < 2:
            return 0.0, max(b / t for t, b in points)
        tokens, sizes = np.array([t for t, _ in points], float), np.array([b for _, b in points], float)
        slope, fixed = np.polyfit(tokens, sizes, 1)
        if slope <= 0:
            return 0.0, float(max(sizes / tokens))
        return max(0.0, float(fixed)), float(slope)

    def predicted(self, rows: int, length: int) -> int | None:
        """A shape's bytes as the shapes measured so far predict them, or None before any."""
        cost = self.cost()
        return None if cost is None else round(cost[0] + cost[1] * rows * length)

    def fits(self, rows: int, length: int) -> bool:
        """Whether a shape of rows x length is predicted to stay within the budget, with room left
        for the dynamic session's largest batch."""
        cost, shape = self.cost(), self.predicted(rows, length)
        if self.budget is None or cost is None or shape is None:
            return True
        return self.used + shape + cost[1] * self.reserve_tokens <= self.budget

    def keep(self, rows: int, length: int, took: int | None, seconds: float) -> bool:
        """Record a shape just captured; whether it stays (False: it passed the budget, and is refused)."""
        if took is not None:
            self.measured.append((rows * length, took))
        self.shapes[(rows, length)] = Shape(rows, length, took, seconds)
        if not self.over():
            return True
        del self.shapes[(rows, length)]
        self.refused.append((rows, length))
        return False

    def over(self) -> bool:
        """Whether what is held, with the room kept for the dynamic session's largest batch, is past
        the budget."""
        cost = self.cost()
        reserve = 0.0 if cost is None else cost[1] * self.reserve_tokens
        return self.budget is not None and self.used + reserve > self.budget

    def describe(self) -> str:
        """The budget and what is held, in words (for the log)."""
        if self.budget is None:
            return "device memory not measured here"
        limit = f"{self.limit:.0%} of the free memory" if isinstance(self.limit, float) else "gpu_memory"
        return f"memory budget {self.budget / 2**30:.1f} GiB ({limit}), {self.used / 2**30:.2f} GiB held"

    def report(self) -> dict[str, Any]:
        """The figures /info and /metrics show: budget, weights, dynamic session, each shape, total."""
        cost = self.cost() if self.budget is not None else None
        return {
            "measured": self.free_at_load is not None,
            "limit": self.limit,
            "free_at_load_bytes": self.free_at_load,
            "budget_bytes": self.budget,
            "weights_bytes": self.weights,
            "dynamic_session_bytes": self.dynamic,
            "shapes": [
                {"rows": s.rows, "length": s.length, "bytes": s.bytes, "capture_seconds": round(s.seconds, 3)}
                for s in sorted(list(self.shapes.values()), key=lambda s: (s.length, s.rows))
            ],
            "reserved_for_dynamic_bytes": None if cost is None else int(cost[1] * self.reserve_tokens),
            "refused_shapes": [f"{r}x{n}" for r, n in list(self.refused)],
            "total_bytes": self.used if self.free_at_load is not None else None,
        }
