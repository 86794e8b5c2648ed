"""The GPU graph on ONNX Runtime at fixed shapes: one session per (rows, length) shape,
each captured as a CUDA graph and fed through IO binding.

A CUDA graph replays a recorded sequence of kernels: ONNX Runtime captures one only when
every node runs on the CUDA provider, which takes fixed shapes (any shape arithmetic left
in the graph runs on the CPU). The fp16 export is made for it (export/gpu.py): with its
free dimensions "batch" and "sequence" fixed when a session is made
(`add_free_dimension_override_by_name`), constant folding leaves no shape node, and the
relative-position indices become initializers.

- Shapes: the lengths are the export's buckets (every batch is padded to one); the rows
  of each length a ladder (1, 2, 4, 8, 16, 24, 32, 48, 64, ...) up to what the token budget
  allows at that length. A batch runs in the smallest shape that holds it, its spare rows
  filled with copies of its first row (their outputs are dropped).
- Sessions are made on first use (a shape no call needs costs nothing) and kept; each has
  its inputs and outputs bound once, on the device, and a run copies the batch in and the
  pooled outputs (B floats and B x L probabilities) out.
- Batching: from the longest block down, a batch padded to its longest
  (engine.core.batching "longest"): a call that fits the token budget is one run.

On the CPU provider (device "cpu") the same sessions run without CUDA graphs: that is how
the tests check the shapes, the padding and the outputs without a GPU.
"""
from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Backend
from engine.backends.onnxruntime import (check_cuda_ran, preload_cuda_libraries, require_cuda, session_options,
                                         thread_denormals)
from engine.core.batching import BatchingConfig, ModelBatch
from engine.errors import BackendError, ModelLoadError
from engine.settings import DEFAULTS

#: rows of a fixed shape, up to the budget's
ROW_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: runs before ONNX Runtime's CUDA provider captures its graph (it captures at the third)
WARMUP_RUNS = 3
OUTPUTS = ("rerank_score", "sentence_probs")


def row_sizes(limit: int) -> tuple[int, ...]:
    """The ladder of row counts up to `limit` (and `limit` itself)."""
    limit = max(1, int(limit))
    return tuple(sorted({r for r in ROW_LADDER if r < limit} | {limit}))


class _Shape:
    """One fixed-shape session with its inputs and outputs bound (on the device)."""

    def __init__(self, ort: Any, session: Any, device: str, rows: int, length: int, input_names: list[str]):
        self.session, self.rows, self.length = session, rows, length
        self.lock = threading.Lock()          # one run at a time: the bound buffers are the graph's
        where = ("cuda", 0) if device == "cuda" else ("cpu", 0)
        self.inputs = {n: ort.OrtValue.ortvalue_from_shape_and_type([rows, length], np.int64, *where)
                       for n in input_names}
        self.outputs = [ort.OrtValue.ortvalue_from_shape_and_type([rows], np.float32, *where),
                        ort.OrtValue.ortvalue_from_shape_and_type([rows, length], np.float32, *where)]
        self.binding = session.io_binding()
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        for name, value in zip(OUTPUTS, self.outputs):
            self.binding.bind_ortvalue_output(name, value)

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        for name, value in self.inputs.items():
            value.update_inplace(np.ascontiguousarray(feeds[name]))
        self.session.run_with_iobinding(self.binding)
        return self.outputs[0].numpy(), self.outputs[1].numpy()


class FixedShapeBackend(Backend):
    """A GPU graph (an fp16 export, manifest `gpu_graph`) in fixed-shape sessions, CUDA
    graphs on device "cuda" (see the module doc)."""
    name = "onnxruntime"

    def __init__(self, graph: str | Path, lengths: list[int], *, device: str = "cuda",
                 batching: BatchingConfig | None = None, cuda_graphs: bool = True, intra_op_threads: int | None = None,
                 log: Any = None):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelLoadError("onnxruntime is not installed: pip install 'prune-engine[gpu]'") from exc
        self.ort, self.graph, self.device = ort, Path(graph), device
        if not self.graph.is_file():
            raise ModelLoadError(f"{graph}: no ONNX graph")
        self.lengths = tuple(sorted(set(int(n) for n in lengths)))
        self.budget = batching or BatchingConfig()
        self.cuda_graphs = bool(cuda_graphs) and device == "cuda"
        self.threads = intra_op_threads
        self.say = log or (lambda m: None)
        self.missing: list[str] = []
        if device == "cuda":
            require_cuda()
            self.missing = preload_cuda_libraries(ort)
        self.shapes: dict[tuple[int, int], _Shape] = {}
        self.lock = threading.Lock()
        first = self._session(*self._shape_for(1, self.lengths[0]))      # fails here, at load, if it must
        self.input_names = [i.name for i in first.session.get_inputs()]
        self.provider = first.session.get_providers()[0]

    # ------------------------------------------------------------------ shapes
    def rows_for(self, length: int) -> tuple[int, ...]:
        """The row counts of the fixed shapes at `length`."""
        cfg = self.budget
        return row_sizes(min(cfg.max_batch_size, max(1, cfg.row_budget(length) // length)))

    def _shape_for(self, rows: int, length: int) -> tuple[int, int]:
        i = bisect.bisect_left(self.lengths, length)
        if i == len(self.lengths) or self.lengths[i] != length:
            raise BackendError(f"a batch of length {length} is not one of this graph's fixed lengths {self.lengths}")
        sizes = self.rows_for(length)
        j = bisect.bisect_left(sizes, rows)
        if j == len(sizes):
            raise BackendError(f"a batch of {rows} rows x {length} exceeds the largest fixed shape "
                               f"({sizes[-1]} x {length}): the token budget is {self.budget.max_batch_tokens}")
        return sizes[j], length

    def batching(self, asked: BatchingConfig) -> BatchingConfig:
        """The pruner's batches: the longest first, padded to this graph's lengths, within
        the budget the shapes were sized by."""
        return BatchingConfig(self.budget.max_batch_tokens, self.budget.max_batch_size, self.lengths, "longest")

    def _session(self, rows: int, length: int) -> _Shape:
        with self.lock:
            shape = self.shapes.get((rows, length))
            if shape is None:
                shape = self.shapes[(rows, length)] = self._make(rows, length)
        return shape

    def _make(self, rows: int, length: int) -> _Shape:
        t0 = time.perf_counter()
        opts, _ = session_options(self.ort, self.threads, None, "keep", DEFAULTS.ort_denormals)
        opts.add_free_dimension_override_by_name("batch", rows)
        opts.add_free_dimension_override_by_name("sequence", length)
        if self.device == "cuda":
            cuda = {"device_id": 0, "use_tf32": 0, "enable_cuda_graph": "1" if self.cuda_graphs else "0"}
            providers: list[Any] = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            with thread_denormals(False):
                session = self.ort.InferenceSession(str(self.graph), sess_options=opts, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"{self.graph}: ONNX Runtime cannot make the {rows} x {length} session "
                                 f"({type(exc).__name__}: {exc})") from exc
        if self.device == "cuda":
            check_cuda_ran(session.get_providers()[0], session.get_providers(), self.missing)
        shape = _Shape(self.ort, session, self.device, rows, length, [i.name for i in session.get_inputs()])
        filler = {n: np.zeros((rows, length), np.int64) for n in shape.inputs}
        filler["attention_mask"][:, 0] = 1
        if "sentence_ids" in filler:
            filler["sentence_ids"][:] = -1
        for _ in range(WARMUP_RUNS if self.cuda_graphs else 1):     # the CUDA graph is captured here
            shape.run(filler)
        self.say(f"GPU graph: {rows} x {length} session made"
                 + (" and captured as a CUDA graph" if self.cuda_graphs else "")
                 + f" in {time.perf_counter() - t0:.1f} s")
        return shape

    # ------------------------------------------------------------------ running
    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, L]) of one padded batch, run in the
        smallest fixed shape that holds it."""
        n, length = batch.shape
        shape = self._session(*self._shape_for(n, length))
        feeds = {}
        for name in shape.inputs:
            array = getattr(batch, name)
            if n < shape.rows:               # spare rows: copies of the first (their outputs are dropped)
                array = np.concatenate([array, np.repeat(array[:1], shape.rows - n, axis=0)])
            feeds[name] = array
        try:
            with shape.lock, thread_denormals(True):
                rerank, probs = shape.run(feeds)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {batch.shape}: {exc}") from exc
        return rerank[:n].copy(), probs[:n].copy()

    def describe(self) -> str:
        """The provider, the graph and the shapes made so far, in words."""
        made = ", ".join(f"{r}x{n}" for r, n in sorted(self.shapes, key=lambda s: (s[1], s[0])))
        return (f"onnxruntime {self.provider} ({self.graph.name}, fixed shapes"
                + (", CUDA graphs" if self.cuda_graphs else "") + f", IO binding; made: {made})")
