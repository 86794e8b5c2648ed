"""The GPU graph on ONNX Runtime: what `--device cuda` runs for an fp16 export (manifest
`gpu_graph`, export/gpu.py), on one GPU, with one copy of the weights and one thread.

- One copy of the weights. The graph's float initializers are read once and put on the
  device once (`SharedWeights`); every session the backend makes gets them through
  `SessionOptions.add_initializer`, which ONNX Runtime uses in place when the tensor is on
  the device its plan puts the weight on (session_state_utils.cc: a user-supplied
  initializer on another device would be copied, and is logged as such). The sessions are
  made from a copy of the graph whose weights are external data beside it, so that making
  a session reads none of them (ONNX Runtime skips the external data of a shared
  initializer). What a session holds of its own: the constants folded at its shape, and
  its activations.
- A dynamic session (no fixed shape, no CUDA graph) runs any batch, at its exact size. It
  is made at load.
- Captured shapes. A CUDA graph replays a recorded sequence of kernels, at one shape:
  ONNX Runtime captures one only when every node runs on the CUDA provider, which the GPU
  graph does at a fixed shape (its free dimensions "batch" and "sequence" fixed by
  `add_free_dimension_override_by_name`: constant folding then leaves no shape node). A
  batch of n rows x L tokens runs in the captured (rows, L) shape whose rows are the
  smallest of GRAPH_ROWS holding n (spare rows copies of the first; their outputs are
  dropped) once that shape is made; until then on the dynamic session, and the shape is
  captured when the GPU is next idle (or, under a load that leaves no idle moment, on its
  CAPTURE_AFTER-th batch), up to `max_graphs` shapes (`warm` shapes are captured at load).
  A shape past the cap keeps running on the dynamic session, and device memory stays
  bounded.
- One thread owns the GPU (`GpuThread`): it makes every session, captures, copies the
  inputs in, runs, and reads the outputs back. ONNX Runtime keeps a captured graph per
  calling thread and captures in CUDA's global mode ("cuda graph can only work with a single
  thread", microsoft/onnxruntime#10423, #15002); callers submit a batch and wait, so
  tokenizing the next calls overlaps the GPU. Between the copies and the replay,
  `synchronize_inputs()`: the copies run on the default stream, the graph on the
  provider's own (microsoft/onnxruntime#11875).
- Sessions on the GPU run one intra-op thread that does not spin (the work is the GPU's).

On the CPU provider (device "cpu") the same sessions run without CUDA graphs: that is how
the tests check the shapes, the sharing, the thread and the outputs without a GPU.
"""

from __future__ import annotations

import bisect
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Backend
from engine.backends.gpu_shared import GpuThread, SharedWeights
from engine.backends.onnxruntime import (
    check_cuda_ran,
    preload_cuda_libraries,
    require_cuda,
    session_options,
    thread_denormals,
)
from engine.pipeline.encode import BatchingConfig, ModelBatch
from engine.pipeline.spec import GRAPH_OUTPUTS
from engine.errors import BackendError, ModelLoadError
from engine.settings import DEFAULTS

#: rows of a captured shape: a batch runs in the smallest that holds it (padding < 2x)
GRAPH_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: a shape not yet captured whose batches keep coming with no idle moment between them is
#: captured on its next batch after this many (that batch waits for the capture)
CAPTURE_AFTER = 8
#: the lengths an LLMLingua-2 chunk (at most 512 tokens) is padded to on the GPU graph
LINGUA_LENGTHS = (64, 128, 256, 384, 512)
#: chunks per batch of the compressor's GPU graph (as engine.compressor.BATCH_CHUNKS on a GPU)
LINGUA_ROWS = 16


def graph_rows(limit: int) -> tuple[int, ...]:
    """The row counts of captured shapes up to `limit` (and `limit` itself)."""
    limit = max(1, int(limit))
    return tuple(sorted({r for r in GRAPH_ROWS if r < limit} | {limit}))


class _Session:
    """One session and how it is run: a captured shape (`rows` x `length`, its inputs and
    outputs bound once on the device), or the dynamic one (rows None: bound per batch). Its
    outputs are the graph's, in its order: [rows] or [rows, length] by their rank."""

    def __init__(self, ort: Any, session: Any, device: str, rows: int | None, length: int | None):
        self.session, self.rows, self.length = session, rows, length
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        ranks = [len(o.shape) for o in session.get_outputs()]
        self.binding = session.io_binding()
        self.runs = 0
        self.inputs: dict[str, Any] = {}
        self.outputs: list[Any] = []
        if rows is None:
            return
        where = ("cuda", 0) if device == "cuda" else ("cpu", 0)
        self.inputs = {
            n: ort.OrtValue.ortvalue_from_shape_and_type([rows, length], np.int64, *where)
            for n in self.input_names
        }
        self.outputs = [
            ort.OrtValue.ortvalue_from_shape_and_type([rows, length][:rank], np.float32, *where)
            for rank in ranks
        ]
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        for name, value in zip(self.output_names, self.outputs):
            self.binding.bind_ortvalue_output(name, value)

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The batch `feeds` (int64, this shape's) through the session; its outputs."""
        self.runs += 1
        if self.rows is None:
            self.binding.clear_binding_inputs()
            self.binding.clear_binding_outputs()
            for name in self.input_names:
                self.binding.bind_cpu_input(name, feeds[name])
            for name in self.output_names:
                self.binding.bind_output(name, "cpu")
            self.session.run_with_iobinding(self.binding)
            return tuple(self.binding.copy_outputs_to_cpu())
        for name, value in self.inputs.items():
            value.update_inplace(feeds[name])
        self.binding.synchronize_inputs()  # the copies are done before the graph reads them
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()
        # copies, made here: on the CPU provider numpy() may be a view of the bound buffer, which
        # the next batch overwrites while the caller still reads it
        return tuple(np.array(value.numpy(), copy=True) for value in self.outputs)


class GpuGraphBackend(Backend):
    """A GPU graph (an fp16 export, manifest `gpu_graph`) on ONNX Runtime's CUDA provider:
    one copy of the weights, a dynamic session, captured shapes, one GPU thread (see the
    module doc). `outputs`: the graph's output names (a pruner's, or a compressor's
    ("token_probs",): GpuTokenProbs). `ort_log_level` and `profile` (a file prefix: every
    session records ONNX Runtime's profile) are for the GPU check (benchmarks/gpu_run/check.py);
    `ort`: the onnxruntime module (a test may hand in a recording one)."""

    name = "onnxruntime"

    def __init__(
        self,
        graph: str | Path,
        lengths: list[int],
        *,
        device: str = "cuda",
        batching: BatchingConfig | None = None,
        cuda_graphs: bool = True,
        max_graphs: int = DEFAULTS.gpu_graphs,
        warm: list[tuple[int, int]] | tuple = (),
        threads: int | None = None,
        ort_log_level: int = 3,
        profile: str | None = None,
        log: Any = None,
        ort: Any = None,
        outputs: tuple[str, ...] = GRAPH_OUTPUTS,  # a pruner's; a compressor's: token_probs
    ):
        if ort is None:
            try:
                import onnxruntime as ort
            except ImportError as exc:
                raise ModelLoadError("onnxruntime is not installed: pip install 'prune-engine[gpu]'") from exc
        self.ort, self.device, self.output_names = ort, device, tuple(outputs)
        self.source = Path(graph)
        if not self.source.is_file():
            raise ModelLoadError(f"{graph}: no ONNX graph")
        self.lengths = tuple(sorted(set(int(n) for n in lengths)))
        self.budget = batching or BatchingConfig()
        self.cuda_graphs = bool(cuda_graphs) and device == "cuda"
        self.max_graphs = max(0, int(max_graphs))
        self.log_level = int(ort_log_level)
        self.profile = profile
        self.threads = 1 if device == "cuda" else threads  # on the GPU the work is the device's
        self.say = log or (lambda m: None)
        self.missing: list[str] = []
        if device == "cuda":
            require_cuda()
            self.missing = preload_cuda_libraries(ort)
        self.shapes: dict[tuple[int, int], _Session] = {}
        self.wanted: list[tuple[int, int]] = []  # shapes to capture when the GPU is idle
        self.failed: dict[tuple[int, int], str] = {}  # shapes whose capture failed, and why
        self.hits: dict[tuple[int, int], int] = {}  # batches each uncaptured shape ran on the dynamic session
        self.weights: SharedWeights | None = None
        self.dynamic: _Session | None = None
        self.gpu = GpuThread(idle=self._capture_one)
        weakref.finalize(self, self.gpu.stop)  # a backend dropped without close() ends its thread
        try:
            self.gpu.call(self._load)
            for rows, length in warm:
                self.gpu.call(self._capture, *self._shape_for(rows, length))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ on the GPU thread
    def _load(self) -> None:
        t0 = time.perf_counter()
        self.weights = SharedWeights(self.ort, self.source, self.device)
        self.dynamic = _Session(self.ort, self._session(None, None), self.device, None, None)
        self.input_names = self.dynamic.input_names
        if tuple(self.dynamic.output_names) != self.output_names:
            raise ModelLoadError(
                f"{self.source}: outputs {self.dynamic.output_names}, not {list(self.output_names)}"
            )
        self.provider = self.dynamic.session.get_providers()[0]
        self.say(
            f"GPU graph: {len(self.weights.values)} weights ({self.weights.bytes / 2**20:.0f} MiB) on "
            f"{self.device} once, shared by every session; dynamic session made in "
            f"{time.perf_counter() - t0:.1f} s"
        )

    def _session(self, rows: int | None, length: int | None) -> Any:
        """A session of the shared weights: at rows x length (captured on cuda), or dynamic."""
        fixed = rows is not None
        opts, _ = session_options(self.ort, self.threads, None, "keep", DEFAULTS.ort_denormals)
        opts.log_severity_level = self.log_level
        if self.profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = self.profile
        if self.device == "cuda":
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if fixed:
            opts.add_free_dimension_override_by_name("batch", rows)
            opts.add_free_dimension_override_by_name("sequence", length)
        self.weights.add_to(opts)
        if self.device == "cuda":
            cuda = {
                "device_id": 0,
                "use_tf32": 0,
                "enable_cuda_graph": "1" if fixed and self.cuda_graphs else "0",
            }
            if fixed:  # a captured shape's memory is what its first run asks for (ORT's CUDA-graph tests)
                cuda["arena_extend_strategy"] = "kSameAsRequested"
            providers: list[Any] = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        what = f"the {rows} x {length}" if fixed else "the dynamic"
        try:
            with thread_denormals(False):
                session = self.ort.InferenceSession(
                    str(self.weights.graph), sess_options=opts, providers=providers
                )
        except Exception as exc:
            raise ModelLoadError(
                f"{self.source}: ONNX Runtime cannot make {what} session ({type(exc).__name__}: {exc})"
            ) from exc
        if self.device == "cuda":
            check_cuda_ran(session.get_providers()[0], session.get_providers(), self.missing)
        return session

    def _capture(self, rows: int, length: int) -> _Session:
        shape = self.shapes.get((rows, length))
        if shape is not None:
            return shape
        t0 = time.perf_counter()
        shape = _Session(self.ort, self._session(rows, length), self.device, rows, length)
        filler = {n: np.zeros((rows, length), np.int64) for n in shape.input_names}
        filler["attention_mask"][:, 0] = 1
        if "sentence_ids" in filler:
            filler["sentence_ids"][:] = -1
        with thread_denormals(True):
            shape.run(filler)  # ONNX Runtime runs until the graph is captured (cuda), then replays
        self.shapes[(rows, length)] = shape
        self.say(
            f"GPU graph: {rows} x {length} session made"
            + (" with CUDA graphs on" if self.cuda_graphs else "")
            + f" in {time.perf_counter() - t0:.1f} s ({len(self.shapes)} of at most {self.max_graphs})"
        )
        return shape

    def _capture_one(self, shape: tuple[int, int] | None = None) -> bool:
        """Capture `shape`, or while the GPU is idle the next wanted shape. Whether there was one."""
        if shape is None:
            if not self.wanted:
                return False
            shape = self.wanted.pop(0)
        try:
            self._capture(*shape)
        except Exception as exc:  # the shape keeps running on the dynamic session
            self.failed[shape] = f"{type(exc).__name__}: {exc}"
            self.say(
                f"GPU graph: the {shape[0]} x {shape[1]} session could not be made ({exc}); "
                "its batches run on the dynamic session"
            )
        return True

    def _run(self, key: tuple[int, int], feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        shape = self.shapes.get(key)
        if shape is None and key in self.wanted and self.hits.get(key, 0) >= CAPTURE_AFTER:
            self.wanted.remove(key)  # a shape this busy is captured now, even with no idle moment
            self._capture_one(key)
            shape = self.shapes.get(key)
        if shape is None:  # the dynamic session, at the batch's own size
            self.hits[key] = self.hits.get(key, 0) + 1
            if (
                key not in self.wanted
                and key not in self.failed
                and len(self.shapes) + len(self.wanted) < self.max_graphs
            ):
                self.wanted.append(key)
            with thread_denormals(True):
                return self.dynamic.run(feeds)
        n = next(iter(feeds.values())).shape[0]
        if n < shape.rows:  # spare rows: copies of the first (their outputs are dropped)
            feeds = {
                name: np.concatenate([a, np.repeat(a[:1], shape.rows - n, axis=0)])
                for name, a in feeds.items()
            }
        with thread_denormals(True):
            return shape.run(feeds)

    # ------------------------------------------------------------------ callers
    def capture(self, rows: int, length: int) -> tuple[int, int]:
        """Capture the shape that holds `rows` x `length` now (a benchmark, before it times
        the shape); the shape."""
        key = self._shape_for(rows, length)
        self.gpu.call(self._capture, *key)
        return key

    def rows_for(self, length: int) -> tuple[int, ...]:
        """The row counts of the captured shapes at `length`."""
        cfg = self.budget
        return graph_rows(min(cfg.max_batch_size, max(1, cfg.row_budget(length) // length)))

    def _shape_for(self, rows: int, length: int) -> tuple[int, int]:
        i = bisect.bisect_left(self.lengths, length)
        if i == len(self.lengths) or self.lengths[i] != length:
            raise BackendError(
                f"a batch of length {length} is not one of this graph's lengths {self.lengths}"
            )
        sizes = self.rows_for(length)
        j = bisect.bisect_left(sizes, rows)
        if j == len(sizes):
            raise BackendError(
                f"a batch of {rows} rows x {length} exceeds the largest shape "
                f"({sizes[-1]} x {length}): the token budget is {self.budget.max_batch_tokens}"
            )
        return sizes[j], length

    def batching(self, asked: BatchingConfig) -> BatchingConfig:
        """The pruner's batches: the longest first, padded to this graph's lengths, within
        the budget the shapes were sized by."""
        return BatchingConfig(
            self.budget.max_batch_tokens, self.budget.max_batch_size, self.lengths, "longest"
        )

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, L]) of one padded batch, run on the GPU
        thread in its captured shape, or on the dynamic session until that shape is made."""
        rerank, probs = self.run({name: getattr(batch, name) for name in self.input_names})
        return rerank, probs

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The graph's outputs for one padded batch (`feeds`: each input, int64, [B, L] with L
        one of the graph's lengths), each cut to the batch's B rows."""
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise BackendError(f"the batch lacks the graph's inputs {missing}")
        arrays = {}
        for name in self.input_names:
            array = np.ascontiguousarray(feeds[name])
            if array.dtype != np.int64:  # a bound input is copied byte for byte
                raise BackendError(f"{name} must be int64, got {array.dtype}")
            arrays[name] = array
        n, length = arrays[self.input_names[0]].shape
        key = self._shape_for(n, length)
        try:
            outputs = self.gpu.call(self._run, key, arrays)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {(n, length)}: {exc}") from exc
        return tuple(out[:n].copy() for out in outputs)

    def close(self) -> None:
        """Free every session and the device copy of the weights, and stop the GPU thread."""

        def free() -> None:
            self.shapes.clear()
            self.wanted.clear()
            self.dynamic = None
            if self.weights is not None:
                self.weights.close()

        if self.gpu.thread.is_alive():
            self.gpu.call(free)
            self.gpu.stop()
        else:
            free()

    def describe(self) -> str:
        """The provider, the graph, the shared weights and the shapes captured so far, in words."""
        made = ", ".join(f"{r}x{n}" for r, n in sorted(self.shapes, key=lambda s: (s[1], s[0]))) or "none yet"
        shared = (
            f"{len(self.weights.values)} weights ({self.weights.bytes / 2**20:.0f} MiB) shared"
            if self.weights is not None and self.weights.values
            else "closed"
        )
        return (
            f"onnxruntime {getattr(self, 'provider', '-')} ({self.source.name}, GPU graph: {shared}, "
            f"a dynamic session and captured shapes ({made}; at most {self.max_graphs})"
            + (", CUDA graphs on" if self.cuda_graphs else "")
            + ", IO binding, one GPU thread)"
        )


class GpuTokenProbs:
    """An LLMLingua-2 fp16 export on the GPU graph (GpuGraphBackend: one copy of the weights on the
    device, captured shapes, one GPU thread): each batch of chunks padded to the next of
    LINGUA_LENGTHS (positions the attention mask leaves out, whose ids do not reach the others)
    and run in the captured shape that holds its rows; `token_probs` as OrtTokenProbs's. `device`
    "cpu" runs the same sessions on the CPU provider, without CUDA graphs (the tests)."""

    name = "onnxruntime"
    #: chunks per run: the rows its shapes are sized for
    batch_chunks = LINGUA_ROWS

    def __init__(self, graph: str | Path, *, device: str = "cuda", **kwargs: Any):
        self.lengths = LINGUA_LENGTHS
        budget = BatchingConfig(max_batch_tokens=LINGUA_ROWS * self.lengths[-1], max_batch_size=LINGUA_ROWS)
        self.backend = GpuGraphBackend(
            graph, list(self.lengths), device=device, batching=budget, outputs=("token_probs",), **kwargs
        )

    def token_probs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph's token_probs (float32, [B, L]) of one batch padded to its longest chunk."""
        n, length = input_ids.shape
        i = bisect.bisect_left(self.lengths, length)
        if i == len(self.lengths):
            raise BackendError(f"a chunk of {length} tokens is longer than {self.lengths[-1]}")
        pad = ((0, 0), (0, self.lengths[i] - length))
        feeds = {"input_ids": np.pad(input_ids, pad), "attention_mask": np.pad(attention_mask, pad)}
        (probs,) = self.backend.run(feeds)
        return probs[:, :length]

    def close(self) -> None:
        """The backend's close: its sessions, the weights on the device, its thread."""
        self.backend.close()

    def describe(self) -> str:
        """The backend's description, in words."""
        return self.backend.describe()
