"""The GPU graph on ONNX Runtime: what `--device cuda` runs for an fp16 export (manifest
`gpu_graph`, export/gpu.py), with one copy of the weights, on the process's one GPU thread.

- One copy of the weights (`SharedWeights`): put on the device once and given to every session
  (`SessionOptions.add_initializer`), which ONNX Runtime uses in place when the tensor is on the
  device its plan wants (session_state_utils.cc), else copies: the load checks it
  (`_verify_shared`) and, where they were copied, says so and captures nothing. The sessions read
  a copy of the graph whose weights are external data, skipped for a shared initializer.
- A dynamic session runs any batch at its exact size. Captured shapes: at a fixed shape
  (`add_free_dimension_override_by_name` on "batch" and "sequence") every node runs on the CUDA
  provider, and ONNX Runtime captures a CUDA graph. A batch of n rows x L runs in the smallest
  captured (rows, L) of GRAPH_ROWS holding n (spare rows copies of the first, dropped). With
  `warm="all"` (the `gpu_warm` setting) every shape is captured at load, smallest first, up to
  `max_graphs` and within the memory budget (gpu_memory.py): ready means warm, no request waits for
  a capture; other shapes run on the dynamic session (`warm="lazy"`: captured when the GPU is next
  idle, or on their CAPTURE_AFTER-th batch).
- One thread owns the GPU for the whole process (`GpuThread.shared()`): every GPU model makes its
  sessions, captures, copies and runs there. ONNX Runtime captures in CUDA's global mode, where
  another thread's copy would fail the capture (microsoft/onnxruntime#10423, #15002). Between the
  copies and the replay, `synchronize_inputs()` (microsoft/onnxruntime#11875).
- Concurrent calls merged (`merge`): batches of one length waiting on the GPU thread run as one, up
  to the largest captured rows at that length; each caller gets its rows back.
- Sessions on the GPU run one intra-op thread that does not spin (the work is the GPU's).

On the CPU provider (device "cpu") the same sessions run without CUDA graphs: that is how the tests
check the shapes, the sharing, the thread, the merging and the outputs without a GPU.
"""

from __future__ import annotations

import bisect
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Backend
from engine.backends.gpu_memory import DeviceMemory, MemoryBudget, parsed_limit
from engine.backends.gpu_shared import BoundSession, GpuThread, SharedWeights
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
#: a dynamic session that took this share of the shared weights' bytes copied them (not shared); told
#: only for weights of VERIFY_MIN_BYTES or more (below, a session's own handles and buffers weigh as much)
SHARED_COPY_SHARE = 0.9
VERIFY_MIN_BYTES = 256 * 2**20


def graph_rows(limit: int) -> tuple[int, ...]:
    """The row counts of captured shapes up to `limit` (and `limit` itself)."""
    limit = max(1, int(limit))
    return tuple(sorted({r for r in GRAPH_ROWS if r < limit} | {limit}))


class GpuGraphBackend(Backend):
    """A GPU graph (an fp16 export, manifest `gpu_graph`) on ONNX Runtime's CUDA provider:
    one copy of the weights, a dynamic session, captured shapes, the process's one GPU thread
    (see the module doc). `outputs`: the graph's output names (a pruner's, or a compressor's
    ("token_probs",): GpuTokenProbs).

    - `warm`: "all" captures at load every shape the batches can take (`serving_shapes`,
      smallest first) within `max_graphs` and the memory budget, so that no request waits for a
      capture; "lazy" captures each shape when the GPU is next idle after its first batch; a
      list of (rows, length) captures those at load.
    - `memory_limit`: the device memory the model may hold (a `gpu_memory` setting: a share of
      the free memory at load, or bytes); `memory` reads the device (a test hands in its own).
    - `merge`: concurrent callers' batches of one length run as one, up to the largest
      captured rows at that length (the token budget's), each caller handed back its rows.
    `ort_log_level` and `profile` (a file prefix: every session records ONNX Runtime's
    profile) are for the GPU check (benchmarks/gpu_run/check.py); `ort`: the onnxruntime module
    (a test may hand in a recording one)."""

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
        warm: str | list[tuple[int, int]] | tuple = (),
        memory_limit: float | int = DEFAULTS.gpu_memory,
        memory: DeviceMemory | None = None,
        merge: bool = True,
        device_id: int = 0,
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
        self.ort, self.device, self.device_id, self.output_names = ort, device, int(device_id), tuple(outputs)
        self.source = Path(graph)
        if not self.source.is_file():
            raise ModelLoadError(f"{graph}: no ONNX graph")
        if isinstance(warm, str) and warm not in ("all", "lazy"):
            raise ModelLoadError(f"warm must be 'all', 'lazy' or a list of shapes, got {warm!r}")
        memory_limit = parsed_limit(memory_limit)
        self.lengths = tuple(sorted(set(int(n) for n in lengths)))
        self.batch_budget = batching or BatchingConfig()
        self.cuda_graphs = bool(cuda_graphs) and device == "cuda"
        self.max_graphs = max(0, int(max_graphs))
        self.merge = bool(merge)
        self.log_level = int(ort_log_level)
        self.profile = profile
        self.threads = 1 if device == "cuda" else threads  # on the GPU the work is the device's
        self.say = log or (lambda m: None)
        self.missing: list[str] = []
        if device == "cuda":
            require_cuda()
            self.missing = preload_cuda_libraries(ort)
        self.shapes: dict[tuple[int, int], BoundSession] = {}
        self.wanted: list[tuple[int, int]] = []  # shapes to capture when the GPU is idle
        self.failed: dict[tuple[int, int], str] = {}  # shapes whose capture failed, and why
        self.hits: dict[tuple[int, int], int] = {}  # batches each uncaptured shape ran on the dynamic session
        self.weights: SharedWeights | None = None
        self.dynamic: BoundSession | None = None
        self.weights_shared: bool | None = None  # verified in place (None: not measurable here)
        self.merged = {"runs": 0, "batches": 0}  # merged runs, and the callers' batches they carried
        self._memory_probe, self._memory_limit = memory, memory_limit
        self.gpu = GpuThread.shared()
        self._release = weakref.finalize(self, self.gpu.release)  # a backend dropped without close()
        self.gpu.add_idle(self._capture_one)
        try:
            self.gpu.call(self._load)
            shapes = self.serving_shapes() if warm == "all" else [] if warm == "lazy" else list(warm)
            self._warm([self._shape_for(rows, length) for rows, length in shapes], warm == "all")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ on the GPU thread
    def _load(self) -> None:
        t0 = time.perf_counter()
        probe = self._memory_probe or DeviceMemory(self.device, self.device_id)
        self.memory = MemoryBudget(probe, self._memory_limit)
        self.memory.reserve_tokens = max(r * n for r, n in self.serving_shapes())
        mark = self.memory.mark()
        self.weights = SharedWeights(self.ort, self.source, self.device, device_id=self.device_id)
        self.memory.weights = self.memory.took(mark)
        mark = self.memory.mark()
        self.dynamic = BoundSession(
            self.ort, self._session(None, None), self.device, None, None, self.device_id
        )
        self.memory.dynamic = self.memory.took(mark)
        self.input_names = self.dynamic.input_names
        if tuple(self.dynamic.output_names) != self.output_names:
            raise ModelLoadError(
                f"{self.source}: outputs {self.dynamic.output_names}, not {list(self.output_names)}"
            )
        self.provider = self.dynamic.session.get_providers()[0]
        self._verify_shared()
        self.say(
            f"GPU graph: {len(self.weights.values)} weights ({self.weights.bytes / 2**20:.0f} MiB) on "
            f"{self.device} once, shared by every session ({self._shared_words()}); dynamic session made in "
            f"{time.perf_counter() - t0:.1f} s; {self._budget_words()}"
        )

    def _verify_shared(self) -> None:
        """Whether the dynamic session used the shared weights in place: ONNX Runtime copies a
        user-supplied initializer whose device is not the one its plan wants
        (session_state_utils.cc), and every session would then hold a copy of its own. A
        session that took at least SHARED_COPY_SHARE of the weights' bytes copied them (told for
        VERIFY_MIN_BYTES of weights or more): that is said loudly, and no shape is captured, so
        the model runs on its dynamic session alone (two copies, not one per captured shape: the
        shared copy stays in onnxruntime's CUDA allocator, which gives no memory back)."""
        taken, weights = self.memory.dynamic, self.weights.bytes
        if taken is None or not weights or weights < VERIFY_MIN_BYTES:
            return
        self.weights_shared = taken < SHARED_COPY_SHARE * weights
        if self.weights_shared:
            return
        message = (
            f"{self.source}: ONNX Runtime copied the shared weights into the dynamic session (it took "
            f"{taken / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights): every captured shape would "
            "hold another copy, so none is captured and the model runs on the dynamic session alone "
            "(slower: no CUDA graphs; the shared copy stays held until the process ends). Check that "
            "onnxruntime-gpu is 1.21 or newer and matches its CUDA libraries."
        )
        self.say("WARNING: " + message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        self.max_graphs = 0

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
                "device_id": self.device_id,
                "use_tf32": 0,
                "enable_cuda_graph": "1" if fixed and self.cuda_graphs else "0",
                # a session's memory is what its runs ask for, not the next power of two (ORT's
                # CUDA-graph tests): the budget counts what a shape holds
                "arena_extend_strategy": "kSameAsRequested",
            }
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

    def _capture(self, rows: int, length: int) -> BoundSession | None:
        """The rows x length session, made and (on cuda) captured, its bytes and seconds measured;
        None when it passed the memory budget (it is released, and the shape refused)."""
        shape = self.shapes.get((rows, length))
        if shape is not None:
            return shape
        mark, t0 = self.memory.mark(), time.perf_counter()
        shape = BoundSession(self.ort, self._session(rows, length), self.device, rows, length, self.device_id)
        filler = {n: np.zeros((rows, length), np.int64) for n in shape.input_names}
        filler["attention_mask"][:, 0] = 1
        if "sentence_ids" in filler:
            filler["sentence_ids"][:] = -1
        with thread_denormals(True):
            shape.run(filler)  # ONNX Runtime runs until the graph is captured (cuda), then replays
        seconds, took = time.perf_counter() - t0, self.memory.took(mark)
        if not self.memory.keep(rows, length, took, seconds):
            del shape  # its session, arena and graph go
            self.say(
                f"GPU graph: {rows} x {length} took {took / 2**20:.0f} MiB, past the memory budget "
                f"({self._budget_words()}): released; its batches run on the dynamic session"
            )
            return None
        self.shapes[(rows, length)] = shape
        held = "" if took is None else f", {took / 2**20:.0f} MiB"
        self.say(
            f"GPU graph: {rows} x {length} session made"
            + (" and captured" if self.cuda_graphs else "")
            + f" in {seconds:.2f} s{held} ({len(self.shapes)} of at most {self.max_graphs})"
        )
        return shape

    def _capture_one(self, shape: tuple[int, int] | None = None) -> bool:
        """Capture `shape`, or while the GPU is idle the next wanted shape, unless the cap or the
        memory budget says no. Whether there was one."""
        if shape is None:
            if not self.wanted:
                return False
            shape = self.wanted.pop(0)
        if shape in self.shapes or shape in self.failed or shape in self.memory.refused:
            return True
        if len(self.shapes) >= self.max_graphs or not self.memory.fits(*shape):
            if shape not in self.memory.refused and len(self.shapes) < self.max_graphs:
                self.memory.refused.append(shape)
            return True
        try:
            self._capture(*shape)
        except Exception as exc:  # the shape keeps running on the dynamic session
            self.failed[shape] = f"{type(exc).__name__}: {exc}"
            self.say(
                f"GPU graph: the {shape[0]} x {shape[1]} session could not be made ({exc}); "
                "its batches run on the dynamic session"
            )
        return True

    def _warm(self, shapes: list[tuple[int, int]], serving: bool) -> None:
        """Capture `shapes` now, in order, each within the cap and the budget (the load waits)."""
        if not shapes:
            return
        t0 = time.perf_counter()
        if serving:
            self.say(
                f"GPU graph: capturing up to {min(len(shapes), self.max_graphs)} shapes before serving "
                f"(smallest first; at most {self.max_graphs}, {self._budget_words()}) ..."
            )
        for shape in shapes:
            self.gpu.call(self._capture_one, shape)
        if serving:
            self.say(
                f"GPU graph: {len(self.shapes)} shapes captured in {time.perf_counter() - t0:.1f} s"
                + (f"; {len(self.memory.refused)} past the budget" if self.memory.refused else "")
                + (f"; {len(self.failed)} failed" if self.failed else "")
            )

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
                and key not in self.memory.refused
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

    def _run_merged(self, payloads: list[dict[str, np.ndarray]]) -> list[tuple[np.ndarray, ...]]:
        """Several callers' batches of one length as one run; each caller's rows of the outputs."""
        if self.dynamic is None:
            raise BackendError("the GPU graph was closed")
        sizes = [p[self.input_names[0]].shape[0] for p in payloads]
        feeds = payloads[0]
        if len(payloads) > 1:
            feeds = {name: np.concatenate([p[name] for p in payloads]) for name in self.input_names}
            self.merged["runs"] += 1
            self.merged["batches"] += len(payloads)
        outputs = self._run(self._shape_for(sum(sizes), feeds[self.input_names[0]].shape[1]), feeds)
        return [tuple(out[e - n : e] for out in outputs) for n, e in zip(sizes, np.cumsum(sizes))]  # fresh

    # ------------------------------------------------------------------ callers
    def serving_shapes(self) -> list[tuple[int, int]]:
        """Every shape a batch can take (each length, each of its row counts), smallest first
        (tokens, then length): what `warm="all"` captures, within the cap and the budget. CUDA
        graphs save most on the small shapes, where launching kernels is most of the time."""
        shapes = [(rows, length) for length in self.lengths for rows in self.rows_for(length)]
        return sorted(shapes, key=lambda s: (s[0] * s[1], s[1]))

    def capture(self, rows: int, length: int) -> tuple[int, int]:
        """Capture the shape that holds `rows` x `length` now (a benchmark, before it times
        the shape); the shape."""
        key = self._shape_for(rows, length)
        self.gpu.call(self._capture, *key)
        return key

    def rows_for(self, length: int) -> tuple[int, ...]:
        """The row counts of the captured shapes at `length`."""
        cfg = self.batch_budget
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
                f"({sizes[-1]} x {length}): the token budget is {self.batch_budget.max_batch_tokens}"
            )
        return sizes[j], length

    def batching(self, asked: BatchingConfig) -> BatchingConfig:
        """The pruner's batches: the longest first, padded to this graph's lengths, within
        the budget the shapes were sized by."""
        cfg = self.batch_budget
        return BatchingConfig(cfg.max_batch_tokens, cfg.max_batch_size, self.lengths, "longest")

    def infer(self, batch: ModelBatch) -> tuple[np.ndarray, np.ndarray]:
        """(rerank_score [B], sentence_probs [B, L]) of one padded batch, run on the GPU
        thread in its captured shape, or on the dynamic session until that shape is made."""
        rerank, probs = self.run({name: getattr(batch, name) for name in self.input_names})
        return rerank, probs

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The graph's outputs for one padded batch (`feeds`: each input, int64, [B, L] with L
        one of the graph's lengths), each cut to the batch's B rows; with `merge`, run together
        with the batches of other callers waiting at the same length."""
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
        try:
            if not self.merge:
                return self.gpu.call(self._run_merged, [arrays])[0]
            return self.gpu.merge(
                (id(self), length), n, self._merge_limit(n, length), self._run_merged, arrays
            )
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"ONNX Runtime failed on a batch of shape {(n, length)}: {exc}") from exc

    def _merge_limit(self, rows: int, length: int) -> int:
        """The rows a merged run at `length` may hold: the largest captured shape's at that length
        (merging never sends the dynamic session a batch no caller would have: the memory budget
        refused the larger shapes), and at least the caller's own shape."""
        own = self._shape_for(rows, length)[0]
        captured = [r for r, n in list(self.shapes) if n == length]
        return max([own, *captured])

    def close(self) -> None:
        """Free every session and the device copy of the weights, and let go of the GPU thread
        (the last model's close ends it)."""

        def free() -> None:
            self.shapes.clear()
            self.wanted.clear()
            self.dynamic = None
            if self.weights is not None:
                self.weights.close()

        if self._release.alive:
            self.gpu.remove_idle(self)
            if self.gpu.thread.is_alive():
                self.gpu.call(free)
            else:
                free()
            self._release()
        else:
            free()

    def report(self) -> dict[str, Any]:
        """The device's figures: budget, weights (and whether they are shared in place), the dynamic
        session, each captured shape's bytes and capture seconds, the total; merged runs."""
        return {
            "device": self.device,
            "provider": getattr(self, "provider", None),
            "weights_shared": self.weights_shared,
            "captured": len(dict(self.shapes)),
            "max_graphs": self.max_graphs,
            "failed_shapes": {f"{r}x{n}": why for (r, n), why in dict(self.failed).items()},
            "merged_runs": self.merged["runs"],
            "merged_batches": self.merged["batches"],
            **self.memory.report(),
        }

    def _budget_words(self) -> str:
        m = getattr(self, "memory", None)
        return m.describe() if m is not None else "device memory not measured here"

    def _shared_words(self) -> str:
        return {True: "verified in place", False: "COPIED", None: "not measurable here"}[self.weights_shared]

    def describe(self) -> str:
        """The provider, the graph, the shared weights and the shapes captured so far, in words."""
        shapes = dict(self.shapes)
        made = ", ".join(f"{r}x{n}" for r, n in sorted(shapes, key=lambda s: (s[1], s[0]))) or "none yet"
        shared = (
            f"{len(self.weights.values)} weights ({self.weights.bytes / 2**20:.0f} MiB) shared"
            if self.weights is not None and self.weights.values
            else "closed"
        )
        return (
            f"onnxruntime {getattr(self, 'provider', '-')} ({self.source.name}, GPU graph: {shared}, "
            f"a dynamic session and captured shapes ({made}; at most {self.max_graphs})"
            + (", CUDA graphs on" if self.cuda_graphs else "")
            + (", concurrent calls merged" if self.merge else "")
            + ", IO binding, the process's one GPU thread)"
        )
